#!/usr/bin/env python3
"""Lab only: give one moto S3 server (a test double of a region's store)
the keys a site would give, before lab.sh turns moto's key checks on.

    s3-keys.py ENDPOINT BUCKET PREFIX ORIGINS WHO...

BUCKET exists already (lab.sh creates it). Creates one IAM user per WHO
with an access key, and prints one line per WHO: `WHO KEY_ID SECRET`. `agent` (the agents' copies between
regions) may do anything; every other WHO is a Unix user whose key may
read, write and delete objects only under PREFIX/<origin>/<WHO>/ for each
cluster in ORIGINS (comma-separated): Fleet's site-default prefixes
(docs/checkpoints.md, "Who can read checkpoints"). Listing is allowed on
the whole bucket, because moto evaluates no `s3:prefix` condition (real S3
would list only the user's prefixes with the policy the docs show); object
names are then visible to all, contents and writes are not.

Runs with moto's key checks still off: lab.sh turns them on afterwards
(POST /moto-api/reset-auth), so every later request needs a key and the
policy of its user.
"""

import json
import sys

import boto3

ANY = {"aws_access_key_id": "lab-setup", "aws_secret_access_key": "lab-setup", "region_name": "us-east-1"}


def user_policy(bucket: str, prefix: str, origins: list[str], who: str) -> dict:
    # moto names an S3 request's action after its API operation
    # (s3:ListObjectsV2, s3:HeadObject, s3:CreateMultipartUpload, ...), not
    # after IAM's action (s3:ListBucket covers the first on real S3), so
    # objects under the user's prefixes get every action, and the bucket the
    # listing and the bulk delete (moto then checks s3:DeleteObject per key).
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:*",
                "Resource": [f"arn:aws:s3:::{bucket}/{prefix}/{o}/{who}/*" for o in origins],
            },
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket", "s3:ListObjectsV2", "s3:ListObjects", "s3:DeleteObjects"],
                "Resource": f"arn:aws:s3:::{bucket}",
            },
        ],
    }


AGENT_POLICY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def main() -> int:
    if len(sys.argv) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    endpoint, bucket, prefix, origins, *who = sys.argv[1:]
    origins = [o for o in origins.split(",") if o]
    iam = boto3.client("iam", endpoint_url=endpoint, **ANY)
    for w in who:
        name = f"fleet-lab-{w}"
        iam.create_user(UserName=name)
        policy = AGENT_POLICY if w == "agent" else user_policy(bucket, prefix, origins, w)
        iam.put_user_policy(UserName=name, PolicyName="ckpt", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        print(w, key["AccessKeyId"], key["SecretAccessKey"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
