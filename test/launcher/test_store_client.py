# SPDX-License-Identifier: Apache-2.0
"""horarun's store client (StoreClient in tools/horarun_lib/store.py, Python) against the server a
job's agents really talk to: hora-store (tools/hora_store.cpp over lib/bootstrap/env/tcp_store.cpp),
started as the agent starts it (StoreProcess). The protocol is written once in each language;
this is where the two meet. Values, counters, waits, the job-token handshake both ways, and the
errors of a store that is gone or was never there; every expected value is computed here.

argv: the built hora-store. HORARUN (environment): the script whose package runs."""

import gc
import hashlib
import hmac
import os
import signal
import socket
import struct
import sys
import threading
import time
import unittest
import warnings

from launcher_util import horarun_module, scaled

STORE_TOOL = None
TOKEN = "5ec7e7-job-token"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StoreTest(unittest.TestCase):
    """Each test starts its own hora-store (with TOKEN unless it says otherwise) and closes
    every client and server it made."""

    token = TOKEN

    @classmethod
    def setUpClass(cls):
        cls.store = horarun_module("store")
        # The agent finds hora-store through this variable first (STORE_TOOL_VAR).
        os.environ[cls.store.STORE_TOOL_VAR] = STORE_TOOL

    def setUp(self):
        self.server = self.store.StoreProcess("127.0.0.1", 0, self.token)
        self.addCleanup(self.close_server)
        self.assertGreater(self.server.port, 0)
        self.assertIsNone(self.server.exit_words())

    def close_server(self):
        """As the agent closes it, then its pipes once the threads reading them saw them end
        (the agent's process exits instead)."""
        self.server.close()
        for thread in threading.enumerate():
            if thread.name == "hora-store output":
                thread.join(scaled(10))
        for pipe in (self.server.proc.stdin, self.server.proc.stdout, self.server.proc.stderr):
            pipe.close()

    def client(self, token=TOKEN, timeout=5.0, port=None):
        c = self.store.StoreClient("127.0.0.1", port or self.server.port, token, timeout)
        self.addCleanup(c.close)
        return c

    def assertRefused(self, token, words):
        start = time.monotonic()
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always", ResourceWarning)
            with self.assertRaises(self.store.StoreError) as caught:
                self.client(token, timeout=30.0)
            # Refused at once: a refusal is final, not retried until the timeout.
            self.assertLess(time.monotonic() - start, scaled(10))
            message = str(caught.exception)
            del caught  # its traceback holds the client: the socket must be closed already
            gc.collect()
        self.assertIn("the store at 127.0.0.1:%d refused this agent: %s (set the same "
                      "HORA_JOB_TOKEN for every agent)" % (self.server.port, words), message)
        self.assertEqual([str(w.message) for w in warned], [], "a refused client's socket left open")


class Values(StoreTest):
    def test_set_get_check(self):
        a, b = self.client(), self.client()
        a.set("job/name", "héllo wörld")
        a.set("job/empty", "")
        a.set("job/bytes", b"\x00\x01raw")
        # The other connection reads what this one wrote: the server holds it.
        self.assertEqual(b.get("job/name", 0), "héllo wörld")
        self.assertEqual(b.get("job/empty", 0), "")
        self.assertEqual(b.get("job/bytes", 0), "\x00\x01raw")
        self.assertIsNone(b.get("job/missing", 0))
        a.set("job/name", "second")
        self.assertEqual(b.get("job/name", 0), "second")
        self.assertTrue(b.check("job/empty"))
        self.assertFalse(b.check("job/missing"))
        long_value = "v" * 100000
        a.set("job/long", long_value)
        self.assertEqual(b.get("job/long", 0), long_value)

    def test_json_and_first_set(self):
        a, b = self.client(), self.client()
        self.assertIsNone(a.get_json("job/failed"))
        a.first_set("job/failures", "job/failed", {"reason": "first", "status": 3})
        b.first_set("job/failures", "job/failed", {"reason": "second", "status": 4})
        self.assertEqual(b.get_json("job/failed"), {"reason": "first", "status": 3})
        self.assertEqual(a.add("job/failures", 0), 2)


class Counters(StoreTest):
    def test_add(self):
        c = self.client()
        expected = 0
        for delta in (1, 41, -50, 0, 7, -(1 << 40), 1 << 40):
            expected += delta
            self.assertEqual(c.add("n", delta), expected)
        self.assertEqual(c.add("fresh"), 1)  # the default delta, from nothing
        # Kept as decimal text, so that get shows a counter readably.
        self.assertEqual(c.get("n", 0), str(expected))
        c.set("text", "7")
        self.assertEqual(c.add("text", 5), 12)

    def test_refused_adds_leave_the_connection_usable(self):
        c = self.client()
        c.set("word", "seven")
        with self.assertRaisesRegex(self.store.StoreError,
                                    "store: key .*word.* holds a value that is not an integer"):
            c.add("word")
        top = (1 << 63) - 1
        c.set("big", str(top))
        with self.assertRaisesRegex(self.store.StoreError, "overflows int64"):
            c.add("big", 1)
        self.assertEqual(c.add("big", -top), 0)
        self.assertEqual(c.get("word", 0), "seven")

    def test_one_client_shared_by_threads(self):
        # The leader thread and the agent's own loop share nothing, but one client is locked for
        # every request: replies never cross between threads.
        c = self.client()
        threads, per_thread = 4, 50
        seen = [[] for _ in range(threads)]

        def work(i):
            for _ in range(per_thread):
                seen[i].append(c.add("shared"))

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(scaled(30))
        total = threads * per_thread
        self.assertEqual(sorted(v for s in seen for v in s), list(range(1, total + 1)))
        self.assertEqual(c.add("shared", 0), total)


class Waits(StoreTest):
    def test_get_times_out(self):
        c = self.client()
        start = time.monotonic()
        self.assertIsNone(c.get("never", 0.3))
        took = time.monotonic() - start
        self.assertGreaterEqual(took, 0.29)
        self.assertLess(took, scaled(5))

    def test_get_waits_for_another_client(self):
        waiter, setter = self.client(), self.client()
        timer = threading.Timer(0.2, setter.set, args=("late", "here"))
        timer.start()
        self.addCleanup(timer.cancel)
        start = time.monotonic()
        self.assertEqual(waiter.get("late", 30), "here")
        took = time.monotonic() - start
        timer.join(scaled(10))  # the setter has its reply before the cleanup closes it
        self.assertGreaterEqual(took, 0.15)
        self.assertLess(took, scaled(10))


def proof(token, label, *parts):
    """The job token's HMAC-SHA256 proof as lib/bootstrap/env/auth.cpp makes it, written again
    here: the label, a NUL, then each part behind its length (8 bytes, little-endian)."""
    message = label + b"\0"
    for part in parts:
        message += len(part).to_bytes(8, "little") + part
    return hmac.new(token, message, hashlib.sha256).digest()


class Token(StoreTest):
    def test_the_job_token_is_accepted(self):
        c = self.client(TOKEN)
        c.set("k", "v")
        self.assertEqual(c.get("k", 0), "v")

    def test_a_wrong_token_is_refused(self):
        self.assertRefused("another-token",
                           "wrong job token: HORA_JOB_TOKEN differs from the job's")

    def test_no_token_is_refused(self):
        self.assertRefused("", "this store requires the job's token: set HORA_JOB_TOKEN to it")

    def test_the_proof_is_auth_cpp_s(self):
        nonce, server_nonce = os.urandom(32), os.urandom(32)
        self.assertEqual(
            self.store.prove_token(b"tok", b"hora-store/1 client", nonce, server_nonce),
            proof(b"tok", b"hora-store/1 client", nonce, server_nonce))
        # Length prefixes: the same bytes split otherwise prove something else.
        self.assertNotEqual(self.store.prove_token(b"tok", b"l", b"ab", b"c"),
                            self.store.prove_token(b"tok", b"l", b"a", b"bc"))


class NoToken(StoreTest):
    token = None

    def test_a_store_without_token_serves_anyone(self):
        c = self.client("")
        self.assertEqual(c.add("n", 3), 3)


class Impostor(unittest.TestCase):
    """A server that asks for the token but cannot prove it knows it (its proof is made with
    another key): the client must not trust it. A fake, since hora-store always proves."""

    def test_a_server_that_cannot_prove_the_token(self):
        store = horarun_module("store")
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.addCleanup(listener.close)
        port = listener.getsockname()[1]

        def recv_exact(sock, n):
            data = sock.recv(n, socket.MSG_WAITALL)  # short only at the end of the stream
            if len(data) < n:
                raise OSError("closed")
            return data

        def read_request(sock):
            (n,) = struct.unpack("<I", recv_exact(sock, 4))
            body = recv_exact(sock, n)
            command, _, argc = struct.unpack_from("<BII", body)
            args, at = [], 9
            for _ in range(argc):
                (size,) = struct.unpack_from("<I", body, at)
                args.append(body[at + 4:at + 4 + size])
                at += 4 + size
            return command, args

        def reply(sock, status, payload):
            sock.sendall(struct.pack("<I", 1 + len(payload)) + bytes([status]) + payload)

        def serve():
            conn, _ = listener.accept()
            with conn:
                try:
                    command, args = read_request(conn)
                    self.assertEqual(command, 6)  # HELLO
                    server_nonce = os.urandom(32)
                    lie = proof(b"not the token", b"hora-store/1 server", args[2], server_nonce)
                    reply(conn, 0, b"\x01" + struct.pack("<I", 32) + server_nonce +
                          struct.pack("<I", len(lie)) + lie)
                    command, _ = read_request(conn)
                    self.assertEqual(command, 7)  # PROOF
                    reply(conn, 0, b"")
                    conn.recv(1)  # until the client hangs up
                except OSError:
                    pass

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        with self.assertRaises(store.StoreError) as caught:
            store.StoreClient("127.0.0.1", port, TOKEN, 5.0)
        self.assertEqual(str(caught.exception), "the store at 127.0.0.1:%d could not prove it "
                         "knows HORA_JOB_TOKEN" % port)
        server.join(scaled(10))


class Lost(StoreTest):
    def test_a_killed_hora_store(self):
        c = self.client()
        c.set("k", "v")
        c.explain = self.server.exit_words  # as the agent that runs it does
        pid = self.server.proc.pid
        os.kill(pid, signal.SIGKILL)
        self.server.proc.wait(scaled(10))
        with self.assertRaises(self.store.StoreError) as caught:
            c.get("k", 0)
        self.assertEqual(str(caught.exception),
                         "lost the rendezvous store at 127.0.0.1:%d: hora-store (pid %d), which "
                         "served the job's store here, was killed by signal 9 (SIGKILL)"
                         % (self.server.port, pid))
        # The connection is closed: later requests say so at once.
        with self.assertRaisesRegex(self.store.StoreError,
                                    "^lost the rendezvous store at 127.0.0.1:%d$"
                                    % self.server.port):
            c.set("k", "w")

    def test_a_store_of_another_host_gone(self):
        # Not this agent's hora-store: nothing local explains it.
        c = self.client()
        self.server.close()
        with self.assertRaises(self.store.StoreError) as caught:
            c.add("n")
        self.assertRegex(str(caught.exception),
                         r"^lost the rendezvous store at 127\.0\.0\.1:%d \(.+\): the hora-store "
                         r"serving it, or its host, is gone$" % self.server.port)

    def test_nothing_listening(self):
        port = free_port()
        start = time.monotonic()
        with self.assertRaises(self.store.StoreError) as caught:
            self.client(timeout=0.5, port=port)
        took = time.monotonic() - start
        self.assertEqual(str(caught.exception), "the rendezvous store at 127.0.0.1:%d is "
                         "unreachable after 0.5 s (Connection refused)" % port)
        # Retried until the timeout, not longer than a retry past it.
        self.assertGreaterEqual(took, 0.5)
        self.assertLess(took, scaled(5))


if __name__ == "__main__":
    STORE_TOOL = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
