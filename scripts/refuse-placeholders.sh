#!/bin/sh
# Entrypoint of every service of the compose stack: refuse to start while a setting still holds a
# placeholder of .env.example (change-me), then run the service's command. `${VAR:?}` in
# docker-compose.yml only checks that a value is there; this checks that it was changed.
#
#   refuse-placeholders.sh <command> [args...]
set -eu
placeholders=$(env | grep -iE '^[A-Za-z_][A-Za-z0-9_]*=.*change[-_]?me' | cut -d= -f1 | sort -u | tr '\n' ' ')
if [ -n "$placeholders" ]; then
  echo "refusing to start: ${placeholders% } still hold(s) the placeholder 'change-me' of .env.example;" \
       "put real values in .env" >&2
  exit 78  # EX_CONFIG
fi
exec "$@"
