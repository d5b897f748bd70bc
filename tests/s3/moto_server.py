#!/usr/bin/env python3
"""A moto S3 server on loopback that checks SigV4 signatures, for the s3 transport's tests.

  moto_server.py start --state FILE [--port N]   start, set up, write FILE, return (server keeps running)
  moto_server.py stop --state FILE               SIGTERM the server FILE names, remove FILE

FILE holds `name=value` lines: endpoint, region, bucket, access_key_id, secret_access_key, pid,
port; or one line `skip=<reason>` when moto is not importable (the tests then report a skip).
Moto verifies signatures only after its first INITIAL_NO_AUTH_ACTION_COUNT requests, which this
script spends creating an IAM user, its access key, an s3:* policy and the bucket. The random
generator is seeded first, so a restarted server (whose state is lost) set up again gets the same
access key: a running client keeps working after a restart.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

REGION = "us-east-1"
BUCKET = "refit-test"
SEED = 4242
READY_TIMEOUT_S = 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc):
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto server not listening on port {port} after {READY_TIMEOUT_S} s")


def launch(port, log_path):
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4")
    # The server must not see credentials of the caller's environment.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(name, None)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        if log_path:
            log.close()  # the server holds its own copy
    wait_ready(port, proc)
    return proc


def set_up(endpoint):
    """Seeds moto's ids, then spends the unauthenticated actions; returns the access key."""
    import boto3
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/seed?a={SEED}", method="POST"),
                           timeout=10).read()
    anon = dict(endpoint_url=endpoint, region_name=REGION, aws_access_key_id="setup",
                aws_secret_access_key="setup")
    iam = boto3.client("iam", **anon)
    iam.create_user(UserName="refit")
    key = iam.create_access_key(UserName="refit")["AccessKey"]
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
    iam.put_user_policy(UserName="refit", PolicyName="s3-all", PolicyDocument=json.dumps(policy))
    boto3.client("s3", **anon).create_bucket(Bucket=BUCKET)
    return key["AccessKeyId"], key["SecretAccessKey"]


def start(port, log_path=None):
    """Starts and sets up a server; returns (process, settings dict)."""
    port = port or free_port()
    proc = launch(port, log_path)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        key_id, secret = set_up(endpoint)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc, {"endpoint": endpoint, "region": REGION, "bucket": BUCKET, "access_key_id": key_id,
                  "secret_access_key": secret, "pid": str(proc.pid), "port": str(port)}


def write_state(path, settings):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for name, value in settings.items():
            f.write(f"{name}={value}\n")
    os.replace(tmp, path)


def read_state(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def moto_missing():
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except Exception as e:  # any import failure means: no server here
        return f"moto/boto3 not importable by {sys.executable}: {e}"
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("--state", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    if args.command == "stop":
        if os.path.exists(args.state):
            pid = read_state(args.state).get("pid")
            if pid:
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.remove(args.state)
        return 0
    reason = moto_missing()
    if reason:
        write_state(args.state, {"skip": reason})
        print(f"moto_server: skip: {reason}")
        return 0
    _, settings = start(args.port, args.log)
    write_state(args.state, settings)
    print(f"moto_server: {settings['endpoint']} pid {settings['pid']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
