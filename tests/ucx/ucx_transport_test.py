#!/usr/bin/env python3
"""The ucx transport between real processes: one `refit send --wait` process per version (it
listens on a free port and publishes it in a rendezvous file) and N `refit recv --follow`
receivers that reconnect to each new sender. Every receiver's model is compared byte for byte
with the weights sent after every version; a receiver SIGKILLed mid-apply (REFIT_KILL_AT) leaves
the others finishing that version, and once restarted catches up.

Environment: REFIT_CLI (the refit binary), REFIT_UCX_TLS (the tls key, e.g. "tcp" or
"posix,tcp"). Usage: ucx_transport_test.py [unittest names]. Exits 77 (ctest's skip code here)
when the refit binary has no ucx transport."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from safetensors_model import make_model, read_safetensors, step, write_safetensors  # noqa: E402

SKIP = 77
BOUND_S = 60  # a refit process that runs longer than this is hung
REFIT = os.environ.get("REFIT_CLI", "")
TLS = os.environ.get("REFIT_UCX_TLS", "tcp")


def versions(n):
    # One 2 MiB tensor: its payloads go as rendezvous, the small ones eagerly.
    v = make_model([1 << 20, 4096, 77], seed=5)
    out = [v]
    for i in range(2, n + 1):
        v = step(v, i)
        out.append(v)
    return out


class UcxCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="refit-ucx-test-")
        self.procs = []
        self.commands = 0
        self.transport_extra = ""
        self.sender_extra = ""
        self.sender_poll_ms = 10
        self.receiver_poll_ms = 20

    def tearDown(self):
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if os.environ.get("REFIT_UCX_KEEP"):
            print("kept", self.dir, file=sys.stderr)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def config(self, receivers, rid, extra="", name=None):
        # The sender has a file of its own: rewriting a receiver's while it starts would race.
        path = os.path.join(self.dir, f"{name or rid}.toml")
        names = ", ".join(f'"r{i}"' for i in range(receivers))
        base = (f'[sender]\nstate_dir = "{self.dir}/sender"\nreceivers = [{names}]\n'
                f"ack_timeout_s = 30\npoll_interval_ms = {self.sender_poll_ms}\n"
                f"{self.sender_extra}\n\n"
                f'[receiver]\nid = "{rid}"\nstate_dir = "{self.dir}/{rid}"\n'
                f"poll_interval_ms = {self.receiver_poll_ms}\n\n"
                f'[transport]\nname = "ucx"\n{self.transport_extra}\n\n'
                f'[transport.ucx]\nlisten = "127.0.0.1:0"\n'
                f'rendezvous_file = "{self.dir}/sender.addr"\nspool_dir = "{self.dir}/spool"\n'
                f'spool_fsync = false\ntls = "{TLS}"\nconnect_timeout_ms = 200\n'
                f"reconnect_max_ms = 200\n").split("\n")
        # A key of `extra` (written into [transport.ucx]) replaces the default written above.
        overridden = {ln.split(" = ")[0] for ln in extra.splitlines() if " = " in ln}
        ucx_at = base.index("[transport.ucx]")
        base = base[:ucx_at] + [ln for ln in base[ucx_at:] if ln.split(" = ")[0] not in overridden]
        with open(path, "w") as f:
            f.write("\n".join(base) + "\n" + extra)
        return path

    def start(self, *args, env_extra=None):
        self.commands += 1
        base = os.path.join(self.dir, f"cmd{self.commands}.{args[0]}")
        env = dict(os.environ)
        env.update(env_extra or {})
        with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
            proc = subprocess.Popen([REFIT, *args], stdout=out, stderr=err, env=env)
        self.procs.append((proc, base))
        return proc, base

    def finish(self, started, bound_s=BOUND_S):
        proc, base = started
        try:
            code = proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.fail(f"refit {base} ran past its bound of {bound_s} s: {self.err(base)}")
        return code, self.err(base)

    @staticmethod
    def err(base):
        with open(base + ".err", errors="replace") as f:
            return f.read()

    def weights(self, tensors, version):
        path = os.path.join(self.dir, f"w{version}.safetensors")
        write_safetensors(path, tensors)
        return path

    def start_receiver(self, receivers, rid, until, env_extra=None, extra=""):
        return self.start("recv", "--config", self.config(receivers, rid, extra), "--follow",
                          "--until-version", str(until), "--timeout", str(BOUND_S),
                          "--quiet", env_extra=env_extra)

    def send(self, receivers, tensors, version, extra=""):
        config = self.config(receivers, "r0", extra, name="sender")
        code, err = self.finish(self.start("send", "--config", config,
                                           "--weights", self.weights(tensors, version), "--wait",
                                           env_extra={"REFIT_LOG": "debug"}))
        self.assertEqual(code, 0, f"send of version {version}: {err}")
        return err

    def assert_model_is(self, rid, tensors, what):
        got = read_safetensors(os.path.join(self.dir, rid, "model.safetensors"))
        want = {name: (dtype, shape, bytes(data)) for name, dtype, shape, data in tensors}
        self.assertEqual(sorted(got), sorted(want), f"{rid} {what}")
        for name in want:
            self.assertTrue(got[name] == want[name], f"{rid} {what}: tensor {name} differs")

    def committed(self, rid):
        try:
            with open(os.path.join(self.dir, rid, "receiver.json")) as f:
                return json.load(f).get("version", 0)
        except (OSError, ValueError):
            return 0

    def wait_committed(self, rid, version):
        deadline = time.monotonic() + BOUND_S
        while self.committed(rid) < version:
            self.assertLess(time.monotonic(), deadline, f"{rid} never committed version {version}")
            time.sleep(0.05)


class Sync(UcxCase):
    def sync(self, receivers, n_versions=3):
        vs = versions(n_versions)
        rids = [f"r{i}" for i in range(receivers)]
        started = {rid: self.start_receiver(receivers, rid, n_versions) for rid in rids}
        for v, tensors in enumerate(vs, start=1):
            err = self.send(receivers, tensors, v)  # --wait: every receiver acknowledged v
            # The transports each connection really uses (a debug line of the sender's).
            self.assertNotIn("UCX  WARN", err)  # e.g. a setting UCX did not use
            self.assertNotIn("UCX  ERROR", err)
            lanes = [ln for ln in err.splitlines() if " lanes: " in ln]
            self.assertTrue(lanes, err)
            for tl in TLS.split(","):
                if tl in ("posix", "sysv", "tcp"):
                    self.assertTrue(all(f"{tl}/" in ln for ln in lanes), f"no {tl} lane: {lanes}")
            for rid in rids:
                self.assert_model_is(rid, tensors, f"after version {v}")
        for rid, proc in started.items():
            code, err = self.finish(proc)
            self.assertEqual(code, 0, f"{rid}: {err}")

    def test_one_receiver(self):
        self.sync(1)

    def test_four_receivers(self):
        self.sync(4)

    def test_eight_receivers(self):
        self.sync(8, n_versions=2)

    def test_a_small_inbox_reads_what_it_evicted_from_the_sender(self):
        # 64 KiB of inbox for 2 MiB of 256 KiB payloads, all pushed before they are applied: each
        # is evicted as the next arrives; the receivers read them from the sender's spool
        # instead (a debug line counts those reads).
        self.sender_extra = 'bucket_bytes = "256KiB"'
        receivers, vs = 2, versions(2)
        rids = [f"r{i}" for i in range(receivers)]
        extra = 'inbox_bytes = "64KiB"\n'
        started = {rid: self.start_receiver(receivers, rid, 2, env_extra={"REFIT_LOG": "debug"},
                                            extra=extra) for rid in rids}
        for v, tensors in enumerate(vs, start=1):
            self.send(receivers, tensors, v)
            for rid in rids:
                self.assert_model_is(rid, tensors, f"after version {v}")
        for rid in rids:
            code, err = self.finish(started[rid])
            self.assertEqual(code, 0, f"{rid}: {err}")
            served = [ln for ln in err.splitlines() if "reads were served by the sender" in ln]
            self.assertTrue(served, err)
            self.assertNotIn(": 0 reads", served[-1])


class WakeUps(UcxCase):
    def test_commits_and_acks_wake_the_peers_that_wait_for_them(self):
        # Both sides poll only every 2 minutes: each version is acknowledged well within the
        # bound only because the commit's arrival wakes the receiver and the ack's the sender.
        self.sender_poll_ms = self.receiver_poll_ms = 120000
        vs = versions(3)
        started = self.start_receiver(1, "r0", len(vs))
        for v, tensors in enumerate(vs, start=1):
            self.send(1, tensors, v)  # --wait: acknowledged, within the bound of a refit process
            self.assert_model_is("r0", tensors, f"after version {v}")
        code, err = self.finish(started)
        self.assertEqual(code, 0, err)


class ServeWakeUps(UcxCase):
    def test_a_commit_wakes_the_poll_loop_of_refit_serve(self):
        # `refit serve` polls only every 2 minutes and nothing pushes a sync to it: each version
        # is applied (and acknowledged within the sender's 30 s ack timeout) only because the
        # commit's arrival wakes its poll loop.
        self.receiver_poll_ms = 120000
        vs = versions(3)
        config = self.config(1, "r0", name="serve")
        with open(config, "a") as f:
            f.write("\n[serve]\npoll_interval_ms = 120000\n")
        served = self.start("serve", "--config", config, "--listen", "127.0.0.1:0")
        for v, tensors in enumerate(vs, start=1):
            self.send(1, tensors, v)  # --wait: acknowledged by the serving receiver
            self.wait_committed("r0", v)
            self.assert_model_is("r0", tensors, f"after version {v}")
        served[0].send_signal(signal.SIGTERM)
        code, err = self.finish(served)
        self.assertEqual(code, 0, err)
        # Each `refit send` said it left, so its exit is no lost connection in the receiver's log.
        self.assertEqual(err.count(" left\n"), len(vs), err)
        self.assertNotIn("connection lost", err)


class BadConfig(UcxCase):
    def test_bad_settings_are_one_error_line(self):
        cases = {'connect = "no-port-here"': "is not \"host:port\"",
                 'connect = "127.0.0.1:99999"': "port > 65535",
                 'tls = "no_such_transport"': "tls",
                 'max_inflight_bytes = "lots"': "max_inflight_bytes"}
        for i, (line, want) in enumerate(cases.items()):
            with self.subTest(line=line):
                path = self.config(1, "r0")
                key = line.split(" = ")[0]
                with open(path) as f:
                    text = "".join(ln for ln in f.readlines() if not ln.startswith(key + " = "))
                text = text.replace("[transport.ucx]\n", f"[transport.ucx]\n{line}\n")
                with open(path, "w") as f:
                    f.write(text)
                code, err = self.finish(self.start("recv", "--config", path))
                self.assertNotEqual(code, 0, line)
                self.assertNotIn(code, (-6, -11), f"crashed on {line}: {err}")
                errors = [ln for ln in err.splitlines() if ln.startswith("refit: error:")]
                self.assertEqual(len(errors), 1, f"{line}: {err}")
                self.assertIn(want, errors[0])


class BenchE2e(UcxCase):
    def test_bench_e2e_runs_its_instances_in_one_process_and_ends_bit_exact(self):
        # The bench creates and destroys several sender and receiver instances in one process
        # (its stage probes): UCX 1.13 aborted in ucp_worker_destroy on a request still posted
        # on an endpoint until CloseAll closed them by force (after a bounded flush).
        path = os.path.join(self.dir, "bench.toml")
        with open(path, "w") as f:
            f.write(f'[transport.ucx]\nrendezvous_file = "{self.dir}/bench.addr"\n'
                    f'spool_dir = "{self.dir}/bench-spool"\nspool_fsync = false\ntls = "{TLS}"\n')
        started = self.start("bench", "e2e", "--size", "32MiB", "--transport", "ucx", "--config",
                             path, "--syncs", "2", env_extra={"REFIT_LOG": "info"})
        code, err = self.finish(started, bound_s=120)
        out = open(started[1] + ".out").read()
        self.assertNotIn("Assertion", err)
        self.assertEqual(code, 0, err)
        self.assertIn("bit-exact: yes", out)
        # The sync's sender (the last instance to go) sent both versions to the receiver, pushed
        # or replayed; the bench's other instances (the stage probes, on a channel of their own)
        # took no receiver from it: it once pushed nothing, a watcher of the same spool having
        # taken its rendezvous file.
        found = BYTES_OUT.findall(err)
        self.assertTrue(found, err)
        _, pushed, replayed, _, _ = map(int, found[-1])
        self.assertGreater(pushed, 0, found)
        self.assertGreaterEqual(pushed + replayed, 32 << 20, found)

    def test_bench_e2e_link_stage_follows_the_plugins_pacing(self):
        # [transport.ucx] link_bandwidth paces each push once per link (the metered
        # [transport] bandwidth charges it at the put and again at the receiver's read): the bench
        # computes its link stage from it and names it in its report.
        path = os.path.join(self.dir, "paced.toml")
        with open(path, "w") as f:
            f.write(f'[transport.ucx]\nrendezvous_file = "{self.dir}/paced.addr"\n'
                    f'spool_dir = "{self.dir}/paced-spool"\nspool_fsync = false\ntls = "{TLS}"\n'
                    'link_bandwidth = "100MB"\n')
        started = self.start("bench", "e2e", "--size", "8MiB", "--transport", "ucx", "--config",
                             path, "--syncs", "2", "--json", env_extra={"REFIT_LOG": "info"})
        code, err = self.finish(started, bound_s=120)
        self.assertEqual(code, 0, err)
        report = json.loads(open(started[1] + ".out").read())
        self.assertEqual(report["bandwidth_bytes_per_s"], 0)
        self.assertEqual(report["link_bandwidth_bytes_per_s"], 100_000_000)
        delta = report["syncs"][1]
        self.assertAlmostEqual(delta["stages_alone"]["link_s"], delta["payload_bytes"] / 1e8)
        self.assertTrue(report["summary"]["bit_exact"])
        # Every byte crossed a paced link: the bench awaits its receiver at the first put (none
        # replayed to it for joining late), and it reads nothing from the sender ahead of the
        # pushes: a size reply names the key's own push, which the receiver waits for (a wait
        # for a count of pushes let the version's manifest and commit, arriving before its
        # payload, release the read, 1 run in ~4). Neither path is paced.
        found = BYTES_OUT.findall(err)
        self.assertTrue(found, err)
        _, pushed, replayed, served, _ = map(int, found[-1])
        self.assertGreater(pushed, 8 << 20, found[-1])
        self.assertEqual((replayed, served), (0, 0), found[-1])


class LinkAndFaults(UcxCase):
    def test_bandwidth_and_faults_wrap_the_ucx_transport(self):
        # The framework's layers above the plugin: a 100 MB/s link for every process, corrupted
        # and failed reads on the receivers (each re-read of a payload it already consumed is
        # served by the sender's spool), corrupted puts on the sender (caught by verify_puts).
        self.transport_extra = 'bandwidth = "100MB"'
        log = os.path.join(self.dir, "faults.log")
        receivers, vs = 2, versions(3)
        rids = [f"r{i}" for i in range(receivers)]

        def faults(seed, kinds):
            return f'[faults]\nseed = {seed}\nlog = "{log}"\n{kinds}\n'

        started = {rid: self.start_receiver(receivers, rid, 3, extra=faults(
            10 + i, "corrupt_get = 0.2\nfail_get = 0.1\ndelay = 0.2\ndelay_ms = 5"))
            for i, rid in enumerate(rids)}
        for v, tensors in enumerate(vs, start=1):
            self.send(receivers, tensors, v, extra=faults(v, "corrupt_put = 0.2"))
            for rid in rids:
                self.assert_model_is(rid, tensors, f"after version {v}")
        for rid in rids:
            code, err = self.finish(started[rid])
            self.assertEqual(code, 0, f"{rid}: {err}")
        with open(log) as f:
            kinds = {line.split()[0] for line in f if line.strip()}
        self.assertTrue({"corrupt_get", "corrupt_put"} <= kinds, f"faults injected: {kinds}")


class HungReceiver(UcxCase):
    def test_a_stopped_receiver_is_dropped_and_never_stalls_the_sender(self):
        # r2 is SIGSTOPped as soon as it connected to the second sender, whose version is a new
        # random model (a 2 MiB payload, sent by rendezvous, which needs r2 to take part): the
        # sender drops r2 after send_timeout_ms, the others finish; r2 resumed catches up.
        receivers, hung = 3, "r2"
        extra = 'send_timeout_ms = 1000\nmax_inflight_bytes = "64KiB"\n'
        vs = [make_model([1 << 20, 4096, 77], seed=5), make_model([1 << 20, 4096, 77], seed=6)]
        rids = [f"r{i}" for i in range(receivers)]
        started = {rid: self.start_receiver(receivers, rid, 2, extra=extra) for rid in rids}
        self.send(receivers, vs[0], 1, extra=extra)
        sender = self.start("send", "--config", self.config(receivers, "r0", extra, name="sender"),
                            "--weights", self.weights(vs[1], 2), "--wait")
        proc, base = started[hung]
        deadline = time.monotonic() + BOUND_S
        while self.err(base).count("connected to the sender") < 2:
            self.assertLess(time.monotonic(), deadline, f"{hung} never reconnected")
            time.sleep(0.002)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for rid in rids:
                if rid != hung:
                    self.wait_committed(rid, 2)
                    self.assert_model_is(rid, vs[1], f"after version 2 ({hung} stopped)")
            while "dropped" not in self.err(sender[1]):
                self.assertLess(time.monotonic(), deadline, f"{hung} was never dropped")
                time.sleep(0.05)
            self.assertIn(f"receiver {hung} dropped: no send completed", self.err(sender[1]))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        code, err = self.finish(sender)
        self.assertEqual(code, 0, f"send of version 2: {err}")
        for rid in rids:
            self.assert_model_is(rid, vs[1], "after version 2")
            code, err = self.finish(started[rid])
            self.assertEqual(code, 0, f"{rid}: {err}")


class KilledReceiver(UcxCase):
    def test_killed_receiver_catches_up_and_the_others_finish(self):
        receivers, victim = 4, "r1"
        vs = versions(3)
        rids = [f"r{i}" for i in range(receivers)]
        started = {rid: self.start_receiver(receivers, rid, 3,
                                            {"REFIT_KILL_AT": "receiver.applying"}
                                            if rid == victim else None) for rid in rids}
        self.send(receivers, vs[0], 1)
        for rid in rids:
            self.assert_model_is(rid, vs[0], "after version 1")
        # Version 2: the victim is SIGKILLed once it starts applying; the sender waits for its ack.
        sender = self.start("send", "--config", self.config(receivers, "r0", name="sender"),
                            "--weights", self.weights(vs[1], 2), "--wait")
        code, err = self.finish(started[victim])
        self.assertEqual(code, -9, f"{victim} was to be killed mid-apply: {err}")
        for rid in rids:
            if rid != victim:
                self.wait_committed(rid, 2)
                self.assert_model_is(rid, vs[1], "after version 2 (one receiver killed)")
        started[victim] = self.start_receiver(receivers, victim, 3)
        code, err = self.finish(sender)
        self.assertEqual(code, 0, f"send of version 2: {err}")
        for rid in rids:
            self.assert_model_is(rid, vs[1], "after version 2 (the killed one restarted)")
        err = self.send(receivers, vs[2], 3)
        self.assertIn(f"receiver {victim} dropped", self.err(sender[1]) + err)
        for rid in rids:
            self.assert_model_is(rid, vs[2], "after version 3")
            code, err = self.finish(started[rid])
            self.assertEqual(code, 0, f"{rid}: {err}")


# The relay tree's suites: k = 2, and each `refit send` waits for every receiver before its first
# put, so that put goes down the tree (a receiver joining after it is replayed it instead).
K = 2
BYTES_OUT = re.compile(r"sender bytes out: (\d+) \(pushed (\d+), replayed (\d+), "
                       r"served to reads (\d+); k = (\d+)\)")
FORWARDED = re.compile(r"(\d+) bytes forwarded to its children")
JOINED = re.compile(r"receiver (r\d+) connected from")


def relay_extra(receivers, more=""):
    return f"k = {K}\nawait_receivers = {receivers}\nconnect_timeout_ms = 20000\n{more}"


class RelayCase(UcxCase):
    def version_bytes(self, version):
        # What the sender put for a version: its objects in the spool (payloads, manifest,
        # commit); the receivers' acks live under acks/.
        top = os.path.join(self.dir, "spool", f"v{version:08d}")
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)

    def bytes_out(self, err):
        found = BYTES_OUT.findall(err)
        self.assertTrue(found, f"no 'sender bytes out' line: {err}")
        total, pushed, replayed, served, k = map(int, found[-1])
        self.assertEqual(k, K)
        return total, pushed, replayed, served

    def join_order(self, sender_base, receivers):
        # The sender's info lines, in the order the receivers joined (and so took tree places).
        deadline = time.monotonic() + BOUND_S
        while True:
            order = JOINED.findall(self.err(sender_base))
            if len(order) >= receivers:
                return order
            self.assertLess(time.monotonic(), deadline, f"only {order} joined")
            time.sleep(0.01)


class RelaySync(RelayCase):
    def test_eight_receivers_through_a_binary_tree(self):
        # Every receiver bit-exact after every version, the sender sending each version k times
        # (not 8), the inner receivers forwarding the rest.
        # The last version only lets the receivers exit (--until-version): one that is done leaves
        # the tree, and receivers below it still waiting for that version read it from the sender.
        receivers, vs = 8, versions(4)
        rids = [f"r{i}" for i in range(receivers)]
        extra = f"k = {K}\n"
        started = {rid: self.start_receiver(receivers, rid, len(vs), extra=extra,
                                            env_extra={"REFIT_LOG": "debug"}) for rid in rids}
        payloads = 0
        for v, tensors in enumerate(vs, start=1):
            err = self.send(receivers, tensors, v, extra=relay_extra(receivers))
            for rid in rids:
                self.assert_model_is(rid, tensors, f"after version {v}")
            if v == len(vs):
                break
            payload = self.version_bytes(v)
            payloads += payload
            total, pushed, replayed, served = self.bytes_out(err)
            # Control overhead: acks of other receivers replayed to each receiver that joins.
            control = 64 * 1024
            self.assertLessEqual(total, K * payload * 1.02 + control,
                                 f"version {v}: {payload} bytes put, sender out {total} "
                                 f"(pushed {pushed}, replayed {replayed}, served {served})")
            self.assertGreaterEqual(pushed, K * payload, f"version {v}: not pushed down the tree")
            self.assertEqual(served, 0, f"version {v}: reads missed the inbox")
        forwarded = 0
        for rid, proc in started.items():
            code, err = self.finish(proc)
            self.assertEqual(code, 0, f"{rid}: {err}")
            found = FORWARDED.findall(err)
            self.assertTrue(found, err)
            forwarded += int(found[-1])
        # The 6 receivers below the sender's 2 children got each version from a relay.
        self.assertGreaterEqual(forwarded, (receivers - K) * payloads)


class RelayFailure(RelayCase):
    def fail_inner_receiver(self, place, how):
        # Version 2 (a new random model: a 2 MiB payload, by rendezvous) crosses links of 4 MB/s
        # per connection, so the receiver at tree place `place` (1: a child of the sender with
        # two children; 3: a child of receiver 1 with two children) is hit mid-sync.
        receivers = 8
        more = 'link_bandwidth = "4MB"\nsend_timeout_ms = 1000\nmax_inflight_bytes = "64KiB"\n'
        vs = [make_model([1 << 20, 4096, 77], seed=5), make_model([1 << 20, 4096, 77], seed=6),
              make_model([1 << 20, 4096, 77], seed=7)]
        rids = [f"r{i}" for i in range(receivers)]
        extra = f"k = {K}\n{more}"
        started = {rid: self.start_receiver(receivers, rid, len(vs), extra=extra) for rid in rids}
        self.send(receivers, vs[0], 1, extra=relay_extra(receivers, more))
        sender = self.start("send", "--config",
                            self.config(receivers, "r0", relay_extra(receivers, more), "sender"),
                            "--weights", self.weights(vs[1], 2), "--wait",
                            env_extra={"REFIT_LOG": "debug"})
        victim = self.join_order(sender[1], receivers)[place - 1]
        time.sleep(0.3)  # the sender is pushing now (its puts wait for the 8 joins)
        proc, base = started[victim]
        os.kill(proc.pid, how)
        try:
            for rid in rids:
                if rid != victim:
                    self.wait_committed(rid, 2)
                    self.assert_model_is(rid, vs[1], f"after version 2 ({victim} failed)")
            deadline = time.monotonic() + BOUND_S
            while f"receiver {victim} dropped" not in self.err(sender[1]):
                self.assertLess(time.monotonic(), deadline, f"{victim} was never dropped")
                time.sleep(0.05)
            self.assertIn(f"relay tree: node {place} left, 7 receivers remain",
                          self.err(sender[1]))
        finally:
            if how == signal.SIGSTOP:
                os.kill(proc.pid, signal.SIGCONT)
        if how == signal.SIGKILL:
            self.finish(started[victim])
            started[victim] = self.start_receiver(receivers, victim, len(vs), extra=extra)
        code, sender_err = self.finish(sender)
        self.assertEqual(code, 0, f"send of version 2: {sender_err}")
        for rid in rids:
            self.assert_model_is(rid, vs[1], "after version 2 (the failed one caught up)")
        self.send(receivers, vs[2], 3, extra=relay_extra(receivers, more))
        for rid in rids:
            self.assert_model_is(rid, vs[2], "after version 3")
            code, err = self.finish(started[rid])
            self.assertEqual(code, 0, f"{rid}: {err}")
        return victim, sender_err

    def test_a_killed_inner_receiver_is_cut_out_of_the_tree_and_catches_up(self):
        self.fail_inner_receiver(1, signal.SIGKILL)

    def test_a_stopped_relay_child_is_reported_by_its_relay_and_dropped(self):
        # Its parent is a relay: the relay's sends to it time out, and the relay tells the sender.
        victim, err = self.fail_inner_receiver(3, signal.SIGSTOP)
        self.assertRegex(err, f"receiver {victim} dropped: its relay r\\d+ reported: no send "
                              "completed")


def main():
    if not REFIT or not os.path.exists(REFIT):
        print("REFIT_CLI is not set to the refit binary", file=sys.stderr)
        return 1
    plugins = subprocess.run([REFIT, "plugins"], capture_output=True, text=True)
    if "ucx" not in plugins.stdout:
        print("skip: this refit has no ucx transport", file=sys.stderr)
        return SKIP
    result = unittest.main(argv=[sys.argv[0], *sys.argv[1:]], exit=False, verbosity=2).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
