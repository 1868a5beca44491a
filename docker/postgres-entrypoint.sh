#!/bin/sh
# Entrypoint of the local postgres image (postgres.Dockerfile), with the official image's contract:
#   POSTGRES_PASSWORD (required), POSTGRES_USER (default postgres), POSTGRES_DB (default the user).
# The first start initialises PGDATA; every start then runs the server on all addresses of the
# container (the stack's network only: compose publishes no port of postgres).
#   docker-entrypoint.sh postgres [server options]   |   docker-entrypoint.sh <other command>
set -eu
if [ "${1:-}" != postgres ]; then
  exec "$@"
fi
shift
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required (the official image refuses to start without it too)}"
user=${POSTGRES_USER:-postgres}
database=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  echo "docker-entrypoint: initialising $PGDATA (superuser $user, database $database)"
  password_file=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" > "$password_file"
  initdb --pgdata="$PGDATA" --username="$user" --pwfile="$password_file" --encoding=UTF8 --locale=C.UTF-8 \
         --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$password_file"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  pg_ctl --pgdata="$PGDATA" --options="-c listen_addresses=''" --wait --silent start
  if [ "$database" != postgres ]; then
    echo 'CREATE DATABASE :"database";' | psql --quiet --set ON_ERROR_STOP=1 --set database="$database" \
      --username="$user" --dbname=postgres
  fi
  pg_ctl --pgdata="$PGDATA" --mode=fast --wait --silent stop
  echo "docker-entrypoint: initialised"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
