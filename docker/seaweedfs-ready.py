"""The object store's health check (docker/seaweedfs.Dockerfile): healthy once S3 answers on 8333 and the
filer lists the bucket named by ``S3_BUCKET`` (default ``lake``). Exit 0 healthy, 1 not yet."""

import os
import sys
import urllib.error
import urllib.request


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


bucket = os.environ.get("S3_BUCKET", "lake")
# S3 refuses an unsigned request (403) once it serves; the filer answers 200 for the bucket's folder.
sys.exit(0 if status("http://127.0.0.1:8333/") == 403 and status(f"http://127.0.0.1:8888/buckets/{bucket}/") == 200
         else 1)
