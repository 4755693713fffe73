"""A self-check of :class:`~nvfs.testing.seaweed.SeaweedServer` against the installed ``weed``.

Run ``python3 -m nvfs.testing.seaweed_check``: it starts a server, exercises the S3 calls the
backend relies on (ranged GETs, delimited listings, multipart uploads, errors) and restarts it on
the same data, so a new SeaweedFS release can be judged before the tests run against it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from nvfs.testing.seaweed import ACCESS_KEY, REGION, SeaweedServer


def self_check() -> None:
    import base64
    import hashlib

    import boto3
    from botocore.exceptions import ClientError

    def error_code(call: Any, **kwargs: Any) -> str:
        try:
            call(**kwargs)
        except ClientError as exc:
            status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
            return f"{exc.response['Error'].get('Code')} (HTTP {status})"
        return "no error"

    def note(what: str, outcome: object) -> None:
        print(f"  {what:<58} {outcome}")

    bucket = "nvfs-selfcheck"
    big = os.urandom(10 << 20)
    with SeaweedServer() as server:
        print(f"started in {server.start_seconds:.2f} s at {server.endpoint_url} (data in {server.data_dir})")
        s3 = server.client()
        server.create_bucket(bucket)
        assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]

        # put / get / head / list / delete of a small object
        put = s3.put_object(Bucket=bucket, Key="hello.txt", Body=b"hello world")
        assert put["ETag"].strip('"') == hashlib.md5(b"hello world").hexdigest()
        assert s3.get_object(Bucket=bucket, Key="hello.txt")["Body"].read() == b"hello world"
        assert s3.head_object(Bucket=bucket, Key="hello.txt")["ContentLength"] == 11
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert keys == ["hello.txt"], keys
        s3.delete_object(Bucket=bucket, Key="hello.txt")
        assert "NoSuchKey" in error_code(s3.get_object, Bucket=bucket, Key="hello.txt")
        assert "404" in error_code(s3.head_object, Bucket=bucket, Key="hello.txt")

        # a 10 MiB object, whole and ranged
        began = time.monotonic()
        s3.put_object(Bucket=bucket, Key="ckpt/big.bin", Body=big)
        put_s = time.monotonic() - began
        began = time.monotonic()
        assert s3.get_object(Bucket=bucket, Key="ckpt/big.bin")["Body"].read() == big
        get_s = time.monotonic() - began
        ranged = s3.get_object(Bucket=bucket, Key="ckpt/big.bin", Range="bytes=4194000-4195999")
        assert ranged["Body"].read() == big[4194000:4196000]
        assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert ranged["ContentRange"] == f"bytes 4194000-4195999/{len(big)}", ranged["ContentRange"]
        tail = s3.get_object(Bucket=bucket, Key="ckpt/big.bin", Range="bytes=-100")["Body"].read()
        assert tail == big[-100:]
        print(f"10 MiB object: PUT {put_s:.2f} s, GET {get_s:.2f} s; ranged GETs ok")

        # listing with a delimiter
        for key in ("ckpt/a/1", "ckpt/a/2", "ckpt/b/1", "top.txt"):
            s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        listing = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
        prefixes = [p["Prefix"] for p in listing.get("CommonPrefixes", [])]
        assert prefixes == ["ckpt/"], prefixes
        assert [o["Key"] for o in listing.get("Contents", [])] == ["top.txt"]
        listing = s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/", Delimiter="/")
        assert [p["Prefix"] for p in listing.get("CommonPrefixes", [])] == ["ckpt/a/", "ckpt/b/"]
        assert [o["Key"] for o in listing.get("Contents", [])] == ["ckpt/big.bin"]
        print("ListObjectsV2 with Delimiter='/': CommonPrefixes ok")

        print("S3 behaviour probes:")
        # list right after put (read-after-write for listings)
        stale = 0
        for i in range(50):
            s3.put_object(Bucket=bucket, Key=f"burst/{i:03d}", Body=b"x")
            listed = s3.list_objects_v2(Bucket=bucket, Prefix="burst/").get("KeyCount", 0)
            stale += listed != i + 1
        note("LIST immediately after each of 50 PUTs: stale listings", stale)
        # pagination
        pages, seen, token = 0, [], None
        while True:
            kwargs = {"ContinuationToken": token} if token else {}
            page = s3.list_objects_v2(Bucket=bucket, Prefix="burst/", MaxKeys=7, **kwargs)
            pages += 1
            seen += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        note(
            "ListObjectsV2 MaxKeys=7 over 50 keys: pages/keys/sorted",
            (pages, len(seen), seen == sorted(seen)),
        )
        page = s3.list_objects_v2(Bucket=bucket, Prefix="burst/", StartAfter="burst/045")
        note("ListObjectsV2 StartAfter=burst/045", [o["Key"] for o in page.get("Contents", [])])
        v1 = s3.list_objects(Bucket=bucket, Prefix="ckpt/", Delimiter="/")
        note("ListObjects (v1) with delimiter", [p["Prefix"] for p in v1.get("CommonPrefixes", [])])
        # overwrite
        s3.put_object(Bucket=bucket, Key="top.txt", Body=b"second version")
        note("GET after overwrite", s3.get_object(Bucket=bucket, Key="top.txt")["Body"].read())
        # conditional reads
        etag = s3.head_object(Bucket=bucket, Key="top.txt")["ETag"]
        note("GET IfMatch=<etag>", s3.get_object(Bucket=bucket, Key="top.txt", IfMatch=etag)["ContentLength"])
        note(
            "GET IfMatch=<wrong etag>", error_code(s3.get_object, Bucket=bucket, Key="top.txt", IfMatch='"0"')
        )
        note(
            "GET IfNoneMatch=<etag>",
            error_code(s3.get_object, Bucket=bucket, Key="top.txt", IfNoneMatch=etag),
        )
        # conditional writes
        note(
            "PUT IfNoneMatch='*' on an existing key",
            error_code(s3.put_object, Bucket=bucket, Key="top.txt", Body=b"x", IfNoneMatch="*"),
        )
        note(
            "PUT IfNoneMatch='*' on a new key",
            error_code(s3.put_object, Bucket=bucket, Key="new.txt", Body=b"x", IfNoneMatch="*"),
        )
        note(
            "PUT IfMatch=<wrong etag>",
            error_code(s3.put_object, Bucket=bucket, Key="top.txt", Body=b"x", IfMatch='"0"'),
        )
        note(
            "PUT IfMatch=<etag>",
            error_code(s3.put_object, Bucket=bucket, Key="top.txt", Body=b"y", IfMatch=etag),
        )
        # copy
        source = {"Bucket": bucket, "Key": "ckpt/big.bin"}
        copied = s3.copy_object(Bucket=bucket, Key="ckpt/copy.bin", CopySource=source)
        same = s3.get_object(Bucket=bucket, Key="ckpt/copy.bin")["Body"].read() == big
        note("CopyObject of 10 MiB: content equal", same)
        note("  ETag in CopyObjectResult", copied["CopyObjectResult"]["ETag"])
        note(
            "  ETag of the source / of the copy (HEAD)",
            (
                s3.head_object(Bucket=bucket, Key="ckpt/big.bin")["ETag"],
                s3.head_object(Bucket=bucket, Key="ckpt/copy.bin")["ETag"],
            ),
        )
        note("  md5 of the content", hashlib.md5(big).hexdigest())
        # multipart
        upload = s3.create_multipart_upload(Bucket=bucket, Key="ckpt/multi.bin")["UploadId"]
        parts = []
        for number, start in enumerate(range(0, len(big), 5 << 20), start=1):
            part = s3.upload_part(
                Bucket=bucket,
                Key="ckpt/multi.bin",
                UploadId=upload,
                PartNumber=number,
                Body=big[start : start + (5 << 20)],
            )
            parts.append({"PartNumber": number, "ETag": part["ETag"]})
        done = s3.complete_multipart_upload(
            Bucket=bucket, Key="ckpt/multi.bin", UploadId=upload, MultipartUpload={"Parts": parts}
        )
        same = s3.get_object(Bucket=bucket, Key="ckpt/multi.bin")["Body"].read() == big
        note("multipart upload (2 x 5 MiB): content equal / ETag", (same, done["ETag"]))
        # batch delete
        deleted = s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": f"burst/{i:03d}"} for i in range(50)] + [{"Key": "no/such/key"}]},
        )
        remaining = s3.list_objects_v2(Bucket=bucket, Prefix="burst/").get("KeyCount")
        note(
            "DeleteObjects of 50 (+1 missing): deleted / errors / left",
            (len(deleted.get("Deleted", [])), len(deleted.get("Errors", [])), remaining),
        )
        prefixes = [p["Prefix"] for p in s3.list_objects_v2(Bucket=bucket, Delimiter="/")["CommonPrefixes"]]
        note("  then LIST Delimiter='/': CommonPrefixes (burst/ is empty)", prefixes)
        note(
            "DELETE of a missing key",
            s3.delete_object(Bucket=bucket, Key="no/such/key")["ResponseMetadata"]["HTTPStatusCode"],
        )
        # errors
        note(
            "GET Range past the end",
            error_code(s3.get_object, Bucket=bucket, Key="top.txt", Range="bytes=100-200"),
        )
        note("GET from a missing bucket", error_code(s3.get_object, Bucket="no-such-bucket", Key="k"))
        note(
            "PUT into a missing bucket",
            error_code(s3.put_object, Bucket="no-such-bucket", Key="k", Body=b"x"),
        )
        note("CreateBucket of an existing bucket", error_code(s3.create_bucket, Bucket=bucket))
        note("DeleteBucket of a non-empty bucket", error_code(s3.delete_bucket, Bucket=bucket))
        bad = boto3.client(
            "s3",
            endpoint_url=server.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key="wrong-secret",
        )
        note("request signed with a wrong secret", error_code(bad.list_objects_v2, Bucket=bucket))
        odd = "ckpt/odd name/ü+%20&=?.bin"
        s3.put_object(Bucket=bucket, Key=odd, Body=b"odd")
        note(
            "key with space, umlaut, + % & = ?: GET back",
            s3.get_object(Bucket=bucket, Key=odd)["Body"].read(),
        )
        wrong_md5 = base64.b64encode(hashlib.md5(b"something else").digest()).decode()
        note(
            "PUT with a wrong Content-MD5",
            error_code(s3.put_object, Bucket=bucket, Key="md5", Body=b"x", ContentMD5=wrong_md5),
        )
        head = s3.head_object(Bucket=bucket, Key="top.txt", ChecksumMode="ENABLED")
        note("HEAD ChecksumMode=ENABLED after a default boto3 PUT", head.get("ChecksumCRC32", "no checksum"))
        s3.put_object(Bucket=bucket, Key="empty", Body=b"")
        note("empty object: ContentLength", s3.head_object(Bucket=bucket, Key="empty")["ContentLength"])

        # restart on the same data and ports
        endpoint = server.endpoint_url
        began = time.monotonic()
        server.stop()
        stop_s = time.monotonic() - began
        server.start()
        total_s = time.monotonic() - began
        assert server.endpoint_url == endpoint
        s3 = server.client()
        assert s3.get_object(Bucket=bucket, Key="ckpt/big.bin")["Body"].read() == big
        assert s3.get_object(Bucket=bucket, Key="ckpt/multi.bin")["Body"].read() == big
        assert s3.get_object(Bucket=bucket, Key="top.txt")["Body"].read() == b"y"
        assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
        server.create_bucket("nvfs-after-restart")  # a new collection: new volume ids must not clash
        s3.put_object(Bucket="nvfs-after-restart", Key="k", Body=big[:1000])
        assert s3.get_object(Bucket="nvfs-after-restart", Key="k")["Body"].read() == big[:1000]
        assert s3.get_object(Bucket=bucket, Key="ckpt/big.bin")["Body"].read() == big
        print(
            f"restart: stop {stop_s:.2f} s + start {server.start_seconds:.2f} s = {total_s:.2f} s; "
            "objects survived"
        )
        began = time.monotonic()
        server.stop(timeout=0)
        server.start()
        assert s3.get_object(Bucket=bucket, Key="ckpt/big.bin")["Body"].read() == big
        print(f"restart after SIGKILL: {time.monotonic() - began:.2f} s; objects survived")
        pid = server.pid
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"weed (pid {pid}) still running after stop")
    print("self-check passed")


if __name__ == "__main__":
    self_check()
