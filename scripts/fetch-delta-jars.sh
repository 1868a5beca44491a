#!/bin/sh
# Delta Lake's jars, and the Hadoop S3A connector that lets delta-spark write an s3:// warehouse, as pinned in
# scripts/delta-jars.lock, into <folder>, each kept only if its SHA-256 is the pinned one: an unverified jar on
# Spark's classpath would run inside every job.
#
#   fetch-delta-jars.sh [--via mvn|curl|none] <folder>
#
#   --via mvn   (make setup, the default) one `mvn dependency:copy-dependencies` (the plugin's version pinned
#               below) of every missing pin, none of their dependencies (the lock lists each jar), from the
#               repositories mvn is configured for (Maven Central unless settings.xml says otherwise; ~/.m2
#               keeps a copy). MVN names another mvn.
#   --via curl  (the image build) straight from $MAVEN, https://repo1.maven.org/maven2 by default.
#   --via none  fetch nothing: keep the pinned jars already there, verified (TRAFFIC_DELTA_JARS=off).
#
# Jars already in <folder> with their pinned sums are not fetched again (the sums: a fraction of a second).
# Exit 0: <folder> holds exactly the pinned jars, verified. Otherwise it holds no jar at all (never part
# of the set, never another version), so the Delta layer's `auto` engine picks rs (delta-rs):
#   1  a jar's SHA-256 is not the pinned one: it is deleted, one line names the file and both sums;
#   3  the jars could not be had (Maven out of reach, no mvn or curl, --via none): one line says why;
#   2  usage, or a malformed lock.
set -eu

usage() { echo "usage: fetch-delta-jars.sh [--via mvn|curl|none] <folder>" >&2; exit 2; }
via=mvn
if [ "${1:-}" = --via ]; then
  [ $# -ge 2 ] || usage
  via=$2
  shift 2
fi
case "$via" in mvn|curl|none) ;; *) usage ;; esac
[ $# -eq 1 ] && [ -n "$1" ] || usage
folder=$1
lock=${DELTA_JARS_LOCK:-$(dirname "$0")/delta-jars.lock}
MAVEN=${MAVEN:-https://repo1.maven.org/maven2}
MVN=${MVN:-mvn}
# Named in full, so no plugin-prefix lookup (repository metadata) stands between mvn and a cached copy.
DEPENDENCY_COPY=org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies

# The pins, one "<coordinate> <sha256> <file name> <path in a Maven repository>" line each.
pins=$(awk -v lock="$lock" '
  /^[[:space:]]*(#|$)/ { next }
  {
    n = split($1, c, ":")
    if (NF != 2 || n != 3 || $2 !~ /^[0-9a-f]+$/ || length($2) != 64) {
      printf "fetch-delta-jars: %s line %d is not \"groupId:artifactId:version <sha256>\": %s\n", lock, NR, $0 > "/dev/stderr"
      bad = 1; exit
    }
    group = c[1]; gsub(/\./, "/", group)
    file = c[2] "-" c[3] ".jar"
    print $1, $2, file, group "/" c[2] "/" c[3] "/" file
  }
  END { exit bad }' "$lock") || exit 2
if [ -z "$pins" ]; then
  echo "fetch-delta-jars: $lock pins no jar" >&2
  exit 2
fi

mkdir -p "$folder"
folder=$(cd "$folder" && pwd)  # absolute: mvn runs from a folder of its own
tmp=$(mktemp -d "$folder/.fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

sha256() { sha256sum "$1" | cut -d' ' -f1; }

first_error() {  # first_error <mvn log>: its first error, colour codes and help links gone, its last 200 characters
  esc=$(printf '\033')
  grep -m1 'ERROR' "$1" | sed -e "s/$esc\[[0-9;]*m//g" -e 's/^\[ERROR\] *//' -e 's/ *-> \[Help [0-9]*\]$//' |
    awk '{ print (length($0) > 200 ? "…" substr($0, length($0) - 199) : $0) } END { if (NR == 0) print "no error line" }'
}

give_up() {  # give_up <exit code> <one line>: leave no jar behind (a partial set would pick the spark engine)
  rm -f "$folder"/*.jar
  echo "$2" >&2
  exit "$1"
}

mvn_fetch() {  # mvn_fetch: every missing pin ($missing, "<coordinate> <file>" lines) into $tmp in one mvn run
  command -v "$MVN" >/dev/null 2>&1 || give_up 3 "Delta's jars could not be fetched from Maven Central ($MVN not found)"
  mkdir -p "$tmp/work"
  echo "$missing" | awk '
    BEGIN { print "<project xmlns=\"http://maven.apache.org/POM/4.0.0\"><modelVersion>4.0.0</modelVersion>"
            print "<groupId>traffic</groupId><artifactId>delta-jars</artifactId><version>1</version><dependencies>" }
    { split($1, c, ":")
      printf "<dependency><groupId>%s</groupId><artifactId>%s</artifactId><version>%s</version>", c[1], c[2], c[3]
      print "<exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions></dependency>" }
    END { print "</dependencies></project>" }' >"$tmp/work/pom.xml"
  # -C: a file whose .sha1 on the repository differs fails here already; -U: a failure mvn cached (it
  # would not try again for a day) is retried; -B: no progress lines.
  if ! (cd "$tmp/work" && "$MVN" -q -B -C -U -Dstyle.color=never "$DEPENDENCY_COPY" -DincludeScope=runtime \
          -DoutputDirectory="$tmp" >"$tmp/log" 2>&1); then
    give_up 3 "Delta's jars could not be fetched from Maven Central (mvn: $(first_error "$tmp/log"))"
  fi
}

fetch() {  # fetch <coordinate> <file> <maven path>: the jar into $tmp (mvn: already there), or give up with the reason
  case "$via" in
    none)
      give_up 3 "Delta's jars were not fetched (TRAFFIC_DELTA_JARS=off) and $folder lacks $2" ;;
    curl)
      command -v curl >/dev/null 2>&1 || give_up 3 "Delta's jars could not be fetched from Maven Central (curl not found)"
      if ! curl -fsSL --proto-redir '=https' --retry 2 -o "$tmp/$2" "$MAVEN/$3" 2>"$tmp/log"; then
        give_up 3 "Delta's jars could not be fetched from Maven Central ($(head -n1 "$tmp/log" | cut -c1-240))"
      fi ;;
  esac
  [ -f "$tmp/$2" ] || give_up 3 "Delta's jars could not be fetched from Maven Central ($via left no $2)"
}

# The pins not already in place with their sums: fetched, by mvn all in one run.
missing=$(echo "$pins" | while read -r coordinate expected file path; do
  if ! { [ -f "$folder/$file" ] && [ "$(sha256 "$folder/$file")" = "$expected" ]; }; then
    echo "$coordinate $file"
  fi
done)
if [ -n "$missing" ] && [ "$via" = mvn ]; then
  mvn_fetch
fi

fetched=""
echo "$pins" | {
  while read -r coordinate expected file path; do
    echo "$missing" | awk -v f="$file" '$2 == f { found = 1 } END { exit !found }' || continue
    fetch "$coordinate" "$file" "$path"
    actual=$(sha256 "$tmp/$file")
    if [ "$actual" != "$expected" ]; then
      rm -f "$tmp/$file"
      give_up 1 "fetch-delta-jars: $file ($coordinate via $via) has SHA-256 $actual, not the pinned $expected ($lock): refused"
    fi
  done
}

# Every pinned jar verified (in $tmp or already in place): drop any other jar (an older version), then move
# the new ones in, delta-spark last — the Delta layer picks the spark engine by that one's presence.
for jar in "$folder"/*.jar; do
  [ -e "$jar" ] || continue
  echo "$pins" | awk -v f="${jar##*/}" '$3 == f { found = 1 } END { exit !found }' || rm -f "$jar"
done
for jar in "$tmp"/*.jar; do
  [ -e "$jar" ] || continue
  case "${jar##*/}" in delta-spark*) ;; *) mv -f "$jar" "$folder/"; fetched="$fetched ${jar##*/}" ;; esac
done
for jar in "$tmp"/delta-spark*.jar; do
  [ -e "$jar" ] || continue
  mv -f "$jar" "$folder/"
  fetched="$fetched ${jar##*/}"
done
if [ -n "$fetched" ]; then
  set -- $fetched
  [ $# -le 4 ] || fetched=" $1, $2 and $(($# - 2)) more"
  echo "fetch-delta-jars: fetched and verified $# jar(s) (SHA-256 as pinned in $lock) into $folder:$fetched"
fi
