#!/bin/sh
# Build step of the image: download Delta Lake's jars into <folder> and keep them only if each one's
# SHA-256 is the pinned one (build arguments DELTA_SPARK_SHA256, DELTA_STORAGE_SHA256; see
# .env.example for how to get them). A jar with another checksum, or one pinned and not the
# other, fails the build: an unverified jar on every Spark classpath would run as every job.
#
#   DELTA_VERSION=4.4.1 SCALA_VERSION=2.13 MAVEN=https://repo1.maven.org/maven2 \
#   DELTA_SPARK_SHA256=<hex> DELTA_STORAGE_SHA256=<hex> fetch-delta-jars.sh /opt/delta-jars
#
# With neither checksum set, no jar is fetched at all: the image then has no Delta jars and the
# Delta layer's `auto` engine picks `rs` (delta-rs), which needs none (also where Maven is out of reach).
set -eu
folder=${1:?usage: fetch-delta-jars.sh <folder>}
: "${DELTA_VERSION:?}" "${SCALA_VERSION:?}" "${MAVEN:?}"
mkdir -p "$folder"
if [ -z "${DELTA_SPARK_SHA256:-}" ] && [ -z "${DELTA_STORAGE_SHA256:-}" ]; then
  echo "fetch-delta-jars: no checksums pinned: building without Delta's jars (the Delta layer runs its rs engine)"
  exit 0
fi

fetch() {  # fetch <url> <file name> <name of the variable holding its sha256>
  url=$1 name=$2 sum_var=$3
  eval "expected=\${$sum_var:-}"
  if ! printf '%s' "$expected" | grep -qiE '^[0-9a-f]{64}$'; then
    echo "fetch-delta-jars: $sum_var must be the SHA-256 (64 hex digits) of $name; got '${expected}'" >&2
    exit 1
  fi
  curl -fsSL --proto-redir '=https' -o "$folder/$name.part" "$url"
  actual=$(sha256sum "$folder/$name.part" | cut -d' ' -f1)
  if [ "$actual" != "$(printf '%s' "$expected" | tr 'A-F' 'a-f')" ]; then
    rm -f "$folder/$name.part"
    echo "fetch-delta-jars: $name from $url has SHA-256 $actual, not the pinned $expected: refused" >&2
    exit 1
  fi
  mv "$folder/$name.part" "$folder/$name"
  echo "fetch-delta-jars: $name verified (sha256 $actual)"
}

fetch "$MAVEN/io/delta/delta-spark_$SCALA_VERSION/$DELTA_VERSION/delta-spark_$SCALA_VERSION-$DELTA_VERSION.jar" \
  "delta-spark_$SCALA_VERSION-$DELTA_VERSION.jar" DELTA_SPARK_SHA256
fetch "$MAVEN/io/delta/delta-storage/$DELTA_VERSION/delta-storage-$DELTA_VERSION.jar" \
  "delta-storage-$DELTA_VERSION.jar" DELTA_STORAGE_SHA256
