#!/usr/bin/env python3
"""The s3 transport against a real S3 server (moto, checking SigV4): real `refit` processes sync
through it bit for bit, boto3 reads what they stored as plain S3 objects, and faults (5xx answers,
a wrong secret, the server killed mid-upload) end in a completed sync or one clear error. Every
output of every process is checked for the secret key.

Environment: REFIT_CLI (the refit binary), REFIT_S3_TEST_SERVER (the file the ctest fixture's
moto_server.py wrote). Exits 77 (ctest's skip code here) when there is no server to test against."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moto_server  # noqa: E402
import s3_proxy  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from safetensors_model import make_model, read_safetensors, step, write_safetensors  # noqa: E402

SKIP = 77
BOUND_S = 60  # a refit process that runs longer than this is hung
REFIT = os.environ.get("REFIT_CLI", "")
SERVER = {}


# ---------------------------------------------------------------- the harness

class S3Case(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="refit-s3-test-")
        self.dir = self.tmp.name
        self.outputs = []  # every captured stdout/stderr file
        self.secrets = {SERVER["secret_access_key"]}
        # No "/": boto3 (through moto 5) cannot list a prefix holding one, see docs/transports.md.
        self.prefix = "t-" + os.path.basename(self.dir)
        self.commands = 0

    def tearDown(self):
        try:
            for path in self.outputs:
                with open(path, "rb") as f:
                    text = f.read()
                for secret in self.secrets:
                    self.assertNotIn(secret.encode(), text, f"a secret key appears in {path}")
        finally:
            self.tmp.cleanup()

    def config(self, name="refit.toml", endpoint=None, secret=None, transport_extra="",
               sender_extra="", credentials=True):
        s3 = {"endpoint": endpoint or SERVER["endpoint"], "region": SERVER["region"],
              "bucket": SERVER["bucket"], "prefix": self.prefix}
        if credentials:
            s3.update(access_key_id=SERVER["access_key_id"],
                      secret_access_key=secret or SERVER["secret_access_key"])
        lines = [f'[sender]\nstate_dir = "{self.dir}/sender"\nreceivers = ["r0"]\nack_timeout_s = 5\n'
                 f"{sender_extra}\n",
                 f'[receiver]\nid = "r0"\nstate_dir = "{self.dir}/receiver"\npoll_interval_ms = 20\n',
                 '[transport]\nname = "s3"\n', "[transport.s3]"]
        lines += [f'{k} = "{v}"' for k, v in s3.items()]
        lines += ["encode_slash_in_query = false  # moto 5 verifies a raw '/'", transport_extra]
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self, *args, env_extra=None):
        self.commands += 1
        base = os.path.join(self.dir, f"cmd{self.commands}.{args[0]}")
        self.outputs += [base + ".out", base + ".err"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["HOME"] = self.dir  # no ~/.aws/credentials of the machine's user
        env.update(env_extra or {})
        env["REFIT_LOG"] = "debug"  # the most the CLI ever prints: still no secret
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            proc = subprocess.Popen([REFIT, *args], stdout=out, stderr=err, env=env)
        return proc, base

    def finish(self, started, bound_s=BOUND_S):
        proc, base = started
        try:
            code = proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.fail(f"refit ran past its bound of {bound_s} s")
        with open(base + ".err", errors="replace") as f:
            return code, f.read()

    def refit(self, *args, bound_s=BOUND_S, env_extra=None):
        return self.finish(self.start(*args, env_extra=env_extra), bound_s)

    def weights(self, tensors, version):
        path = os.path.join(self.dir, f"w{version}.safetensors")
        write_safetensors(path, tensors)
        return path

    def send(self, config, weights, env_extra=None):
        return self.refit("send", "--config", config, "--weights", weights, env_extra=env_extra)

    def recv(self, config, env_extra=None):
        return self.refit("recv", "--config", config, env_extra=env_extra)

    def assert_model_is(self, tensors, what):
        got = read_safetensors(os.path.join(self.dir, "receiver", "model.safetensors"))
        want = {name: (dtype, shape, bytes(data)) for name, dtype, shape, data in tensors}
        self.assertEqual(sorted(got), sorted(want), what)
        for name in want:
            self.assertTrue(got[name] == want[name], f"{what}: tensor {name} differs")

    def sync_versions(self, config, versions):
        for v, tensors in enumerate(versions, start=1):
            code, err = self.send(config, self.weights(tensors, v))
            self.assertEqual(code, 0, f"send of version {v}: {err}")
            code, err = self.recv(config)
            self.assertEqual(code, 0, f"recv of version {v}: {err}")
            self.assert_model_is(tensors, f"after version {v}")

    def boto3(self):
        import boto3
        return boto3.client("s3", endpoint_url=SERVER["endpoint"], region_name=SERVER["region"],
                            aws_access_key_id=SERVER["access_key_id"],
                            aws_secret_access_key=SERVER["secret_access_key"])


def error_lines(err):
    return [line for line in err.splitlines() if line.startswith("refit: error:")]


# ---------------------------------------------------------------- tests

class SyncThroughS3(S3Case):
    def test_small_model_syncs_bit_exact(self):
        # Objects of someone else under the prefix whose names are not keys: every listing skips
        # them. (Names with XML-escaped characters like '&' cannot be made here: moto 5 rejects
        # their signatures.)
        s3 = self.boto3()
        for foreign in ("v00000001/notes draft.txt", "very odd name"):
            s3.put_object(Bucket=SERVER["bucket"], Key=f"{self.prefix}/{foreign}", Body=b"x")
        v1 = make_model([4096, 1000, 77], seed=1)
        self.sync_versions(self.config(), [v1, step(v1, 2), step(step(v1, 2), 3)])

    def test_large_model_goes_multipart_and_boto3_reads_plain_objects(self):
        # ~64 MB of BF16: 16 MiB payloads in 5 MiB parts, so every full-sync payload is multipart.
        v1 = make_model([4 << 20] * 8, seed=7)
        config = self.config(transport_extra="part_bytes = \"5MiB\"\nconcurrency = 4",
                             sender_extra='bucket_bytes = "16MiB"')
        self.sync_versions(config, [v1, step(v1, 2)])

        s3 = self.boto3()
        objects, token = {}, None
        for _ in range(100):
            page = s3.list_objects_v2(Bucket=SERVER["bucket"], Prefix=self.prefix,
                                      **({"ContinuationToken": token} if token else {}))
            objects.update({o["Key"]: o for o in page.get("Contents", [])})
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        keys = [k[len(self.prefix) + 1:] for k in objects]
        self.assertIn("v00000001/COMMIT", keys)
        self.assertIn("v00000002/COMMIT", keys)
        payloads = [k for k in objects if "/v00000001/payload." in k]
        self.assertGreaterEqual(len(payloads), 4, keys)
        multipart = [k for k in payloads if objects[k]["ETag"].strip('"').endswith("-4")]
        self.assertTrue(multipart, "no 16 MiB payload has a 4-part multipart ETag: " +
                        str([objects[k]["ETag"] for k in payloads]))
        self.assertFalse(s3.list_multipart_uploads(Bucket=SERVER["bucket"],
                                                   Prefix=self.prefix).get("Uploads"),
                         "an incomplete multipart upload was left behind")

        # The objects are plain: copied into a directory, the disk transport syncs from them.
        mirror = os.path.join(self.dir, "mirror")
        for key, rel in zip(objects, keys):
            os.makedirs(os.path.dirname(os.path.join(mirror, rel)), exist_ok=True)
            s3.download_file(SERVER["bucket"], key, os.path.join(mirror, rel))
        disk = os.path.join(self.dir, "disk.toml")
        with open(disk, "w") as f:
            f.write(f'[receiver]\nid = "m0"\nstate_dir = "{self.dir}/mirror-receiver"\n'
                    f'[transport]\nname = "disk"\n[transport.disk]\ndir = "{mirror}"\n')
        code, err = self.recv(disk)
        self.assertEqual(code, 0, err)
        got = read_safetensors(os.path.join(self.dir, "mirror-receiver", "model.safetensors"))
        self.assertEqual(got, {n: (d, s, bytes(b)) for n, d, s, b in step(v1, 2)})


class Faults(S3Case):
    def proxied(self, fail, **kw):
        proxy = s3_proxy.Proxy(int(SERVER["port"]), fail)
        self.addCleanup(proxy.close)
        return proxy, self.config(endpoint=f"http://127.0.0.1:{proxy.port}", **kw)

    def test_5xx_answers_are_retried(self):
        # The first three requests and then every fifth get 503: each is retried with backoff.
        proxy, config = self.proxied(lambda i, m, p: i < 3 or i % 5 == 0,
                                     transport_extra="max_retries = 5\nretry_base_ms = 5\n"
                                                     "retry_max_ms = 50")
        v1 = make_model([4096, 512], seed=3)
        self.sync_versions(config, [v1, step(v1, 2)])
        seen = proxy.snapshot()
        failed = [r for r in seen if r[2] == 503]
        self.assertEqual(len(failed), sum(1 for i in range(len(seen)) if i < 3 or i % 5 == 0))
        # Every 503 was followed by the same request again (the retry), and nothing else failed.
        for i, (method, path, status) in enumerate(seen):
            if status == 503 and i + 1 < len(seen):
                self.assertIn((method, path), [(m, p) for m, p, _ in seen[i + 1:i + 8]])
        self.assertTrue(all(s in (200, 204, 206, 404, 503) for _, _, s in seen), seen)

    def test_retries_are_bounded(self):
        proxy, config = self.proxied(lambda i, m, p: True,
                                     transport_extra="max_retries = 2\nretry_base_ms = 5\n"
                                                     "retry_max_ms = 20")
        code, err = self.send(config, self.weights(make_model([64], seed=4), 1))
        self.assertEqual(code, 1, err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn("HTTP 503", err)
        self.assertIn("gave up after 3 attempts", err)
        seen = proxy.snapshot()
        self.assertEqual(len(seen), 3, seen)  # the first operation, tried 1 + max_retries times
        self.assertEqual(len({(m, p) for m, p, _ in seen}), 1, seen)

    def test_wrong_secret_is_one_403_and_one_request(self):
        wrong = "x" + SERVER["secret_access_key"][1:]
        self.secrets.add(wrong)
        proxy, config = self.proxied(None, secret=wrong)
        code, err = self.send(config, self.weights(make_model([64], seed=5), 1))
        self.assertEqual(code, 1, err)
        lines = error_lines(err)
        self.assertEqual(len(lines), 1, err)
        self.assertIn("403", lines[0])
        self.assertIn(SERVER["bucket"], lines[0])
        seen = proxy.snapshot()
        self.assertEqual(len(seen), 1, f"a 4xx was retried: {seen}")
        if seen[0][0] != "HEAD":  # a HEAD answer has no body to name the code in
            self.assertIn("SignatureDoesNotMatch", lines[0])


class Credentials(S3Case):
    """Without credential keys in the config: the AWS_* variables, else a credentials file."""

    def sync_with(self, env_extra):
        config = self.config(credentials=False)
        v1 = make_model([256], seed=21)
        code, err = self.send(config, self.weights(v1, 1), env_extra=env_extra)
        self.assertEqual(code, 0, err)
        code, err = self.recv(config, env_extra=env_extra)
        self.assertEqual(code, 0, err)
        self.assert_model_is(v1, "synced with credentials from outside the config")

    def test_environment_variables(self):
        self.sync_with({"AWS_ACCESS_KEY_ID": SERVER["access_key_id"],
                        "AWS_SECRET_ACCESS_KEY": SERVER["secret_access_key"]})

    def test_shared_credentials_file_profile(self):
        path = os.path.join(self.dir, "credentials")
        with open(path, "w") as f:
            f.write("[default]\naws_access_key_id = nobody\naws_secret_access_key = nothing\n"
                    f"[refit]\naws_access_key_id = {SERVER['access_key_id']}\n"
                    f"aws_secret_access_key = {SERVER['secret_access_key']}\n")
        self.sync_with({"AWS_SHARED_CREDENTIALS_FILE": path, "AWS_PROFILE": "refit"})

    def test_none_is_one_error_line(self):
        code, err = self.send(self.config(credentials=False),
                              self.weights(make_model([16], seed=22), 1))
        self.assertNotEqual(code, 0, err)
        self.assertEqual(len(error_lines(err)), 1, err)
        self.assertIn("no credentials", err)


class ServerKilledMidUpload(S3Case):
    """moto SIGKILLed while parts are uploading, then restarted empty and set up again. The client
    reaches it through the proxy, which drops connections until the new server is set up (moto
    lets its first requests through unauthenticated: those must be the setup's own)."""

    def test_sync_completes_or_fails_cleanly(self):
        global SERVER
        shared = SERVER
        log = os.path.join(self.dir, "moto.log")
        proc, SERVER = moto_server.start(0, log)
        self.addCleanup(lambda: proc.kill() or proc.wait())
        self.secrets.add(SERVER["secret_access_key"])
        self.outputs.append(log)  # the server's own log: no secret there either
        try:
            self.run_kill_and_restart(log, proc)
        finally:
            SERVER = shared

    def run_kill_and_restart(self, log, proc):
        v1 = make_model([4 << 20] * 4, seed=11)
        proxy = s3_proxy.Proxy(int(SERVER["port"]))
        self.addCleanup(proxy.close)
        config = self.config(endpoint=f"http://127.0.0.1:{proxy.port}",
                             transport_extra='part_bytes = "5MiB"\nconcurrency = 2\n'
                                             "max_retries = 10\nretry_base_ms = 100\n"
                                             "retry_max_ms = 800",
                             sender_extra='bucket_bytes = "16MiB"')
        sender = self.start("send", "--config", config, "--weights", self.weights(v1, 1))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any("partNumber=" in p for _, p, _ in proxy.snapshot()):
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proxy.down = True
        proc.wait()
        restarted, _ = moto_server.start(int(SERVER["port"]), log)
        self.addCleanup(lambda: restarted.kill() or restarted.wait())
        proxy.down = False
        code, err = self.finish(sender)
        self.assertIn(code, (0, 1), err)
        if code == 1:
            self.assertEqual(len(error_lines(err)), 1, err)
        code, err = self.recv(config)
        state_path = os.path.join(self.dir, "receiver", "receiver.json")
        state = json.load(open(state_path)) if os.path.exists(state_path) else {}
        if code != 0:
            self.assertEqual(len(error_lines(err)), 1, err)
        if state.get("version"):  # committed: then it is version 1, whole
            self.assertEqual(state["version"], 1, state)
            self.assert_model_is(v1, "after the restart")
        else:
            self.assertFalse(os.path.exists(os.path.join(self.dir, "receiver", "model.safetensors")),
                             "no version was committed, yet the receiver has a model")
        # However it ended, the next versions sync bit-exact.
        v2 = step(v1, 2)
        for attempt in range(3):
            code, err = self.send(config, self.weights(v2, 2))
            if code == 0:
                break
        self.assertEqual(code, 0, err)
        code, err = self.recv(config)
        self.assertEqual(code, 0, err)
        self.assert_model_is(v2, "after the next version")


def main():
    global SERVER
    path = os.environ.get("REFIT_S3_TEST_SERVER", "")
    if not REFIT or not os.path.exists(REFIT):
        print("skip: REFIT_CLI does not name the refit binary")
        return SKIP
    if not path or not os.path.exists(path):
        print("skip: no S3 test server (REFIT_S3_TEST_SERVER is unset or names no file)")
        return SKIP
    SERVER = moto_server.read_state(path)
    if "skip" in SERVER:
        print("skip: " + SERVER["skip"])
        return SKIP
    result = unittest.main(argv=[sys.argv[0], *sys.argv[1:]], exit=False, verbosity=2).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
