# SPDX-License-Identifier: Apache-2.0
"""The job's store as the agents use it: StoreClient speaks the protocol of
lib/bootstrap/env/tcp_store.cpp (its handshake proves HORA_JOB_TOKEN as auth.cpp does), and
StoreProcess runs hora-store (tools/hora_store.cpp), the server, for the agent that serves it."""

import errno
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

from .common import (TOKEN_VAR, AgentError, describe_exit, find_tool, make_child_setup)

STORE_TOOL_VAR = "HORARUN_HORA_STORE"


class StoreError(AgentError):
    """The store refused a request, did not answer, or is gone."""


def prove_token(token, label, *parts):
    """HMAC-SHA256 proof of the job token, as lib/bootstrap/env/auth.cpp makes it."""
    message = label + b"\0" + b"".join(struct.pack("<Q", len(p)) + p for p in parts)
    return hmac.new(token, message, hashlib.sha256).digest()


class StoreClient:
    """One connection to a hora store (the protocol of lib/bootstrap/env/tcp_store.cpp)."""

    SET, GET, ADD, CHECK, WAIT, HELLO, PROOF = 1, 2, 3, 4, 5, 6, 7
    OK, TIMED_OUT, FAILED, BUSY = 0, 1, 2, 3

    def __init__(self, host, port, token, timeout):
        self.address = "%s:%d" % (host, port)
        self.lock = threading.Lock()
        # () -> why the store is gone, where this process knows (its own hora-store), or None
        self.explain = None
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            why = None
            try:
                self.sock = socket.create_connection((host, port), timeout=10)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.handshake(token.encode() if token else b""):
                    return
                why = getattr(self, "busy", None) or "busy"
            except OSError as e:
                why = e.strerror or str(e)
            except StoreError:
                self.close()  # refused, or not a hora store: final, and the socket goes now
                raise
            self.close()
            if time.monotonic() >= deadline:
                raise StoreError("the rendezvous store at %s is unreachable after %g s (%s)"
                                 % (self.address, timeout, why))
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def close(self):
        sock, self.sock = getattr(self, "sock", None), None
        if sock is not None:
            sock.close()

    def handshake(self, token):
        nonce = secrets.token_bytes(32)
        status, payload = self.request(self.HELLO, [b"hora-store/1", b"", nonce])
        if status == self.BUSY:
            self.busy = payload.decode("utf-8", "replace")
            return False
        if status != self.OK or len(payload) < 5:
            raise StoreError("%s is not a hora store" % self.address)
        required = payload[0]
        (n,) = struct.unpack_from("<I", payload, 1)
        server_nonce = payload[5:5 + n]
        (m,) = struct.unpack_from("<I", payload, 5 + n)
        server_proof = payload[9 + n:9 + n + m]
        mine = prove_token(token, b"hora-store/1 client", nonce, server_nonce) if token else b""
        status, payload = self.request(self.PROOF, [mine])
        if status == self.BUSY:  # full for now: a fresh connection later
            self.busy = payload.decode("utf-8", "replace")
            return False
        if status != self.OK:
            raise StoreError("the store at %s refused this agent: %s (set the same "
                             "HORA_JOB_TOKEN for every agent)" % (self.address,
                                                                  payload.decode("utf-8", "replace")))
        if required and not hmac.compare_digest(
                server_proof, prove_token(token, b"hora-store/1 server", nonce, server_nonce)):
            raise StoreError("the store at %s could not prove it knows HORA_JOB_TOKEN" % self.address)
        return True

    def recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise OSError(errno.ECONNRESET, "closed by the store")
            data += chunk
        return data

    def request(self, command, args, wait_s=0.0):
        body = struct.pack("<BII", command, int(wait_s * 1000), len(args))
        body += b"".join(struct.pack("<I", len(a)) + a for a in args)
        with self.lock:
            if self.sock is None:
                raise StoreError("lost the rendezvous store at %s" % self.address)
            try:
                self.sock.settimeout(wait_s + 30)
                self.sock.sendall(struct.pack("<I", len(body)) + body)
                (n,) = struct.unpack("<I", self.recv_exact(4))
                reply = self.recv_exact(n)
            except OSError as e:
                self.close()
                local = self.explain() if self.explain is not None else None
                if local:
                    raise StoreError("lost the rendezvous store at %s: %s" % (self.address, local))
                if isinstance(e, socket.timeout):
                    raise StoreError("the rendezvous store at %s did not answer within %g s: the "
                                     "hora-store serving it is stuck, or its host is overloaded"
                                     % (self.address, wait_s + 30))
                raise StoreError("lost the rendezvous store at %s (%s): the hora-store serving "
                                 "it, or its host, is gone" % (self.address, e.strerror or e))
        return reply[0], reply[1:]

    @staticmethod
    def key(k):
        return k.encode("utf-8")

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode("utf-8")
        self.request(self.SET, [self.key(key), value])

    def get(self, key, wait_s):
        """The value, or None when the key did not appear within wait_s (0: now)."""
        status, payload = self.request(self.GET, [self.key(key)], wait_s)
        return payload.decode("utf-8", "replace") if status == self.OK else None

    def add(self, key, delta=1):
        status, payload = self.request(self.ADD, [self.key(key), struct.pack("<q", delta)])
        if status != self.OK:
            raise StoreError("store: %s" % payload.decode("utf-8", "replace"))
        return struct.unpack("<q", payload)[0]

    def check(self, key):
        return self.request(self.CHECK, [self.key(key)])[1] == b"\x01"

    def get_json(self, key, wait_s=0.0):
        text = self.get(key, wait_s)
        return None if text is None else json.loads(text)

    def first_set(self, counter, key, value):
        """Sets key unless another agent did first (the first to add to counter wins)."""
        if self.add(counter) == 1:
            self.set(key, json.dumps(value))


class StoreProcess:
    """hora-store, serving the job's store for as long as this agent lives."""

    def __init__(self, host, port, token):
        exe = find_tool("hora-store", STORE_TOOL_VAR)
        if exe is None:
            raise AgentError("hora-store not found (beside horarun, in the build, on PATH, or "
                             "$%s): the agent at the rendezvous endpoint runs it" % STORE_TOOL_VAR)
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        if token:
            env[TOKEN_VAR] = token
        self.proc = subprocess.Popen([exe, "--host", host, "--port", str(port)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=make_child_setup(os.getpid()))
        line = self.proc.stdout.readline().decode("utf-8", "replace")
        if not line.startswith("hora-store listening on "):
            err = self.proc.stderr.read().decode("utf-8", "replace").strip()
            self.proc.wait()
            raise AgentError(err or "hora-store exited without serving")
        self.port = int(line.split()[-1])
        # From here on its output is read as it comes (stderr passed on to ours, stdout dropped):
        # a pipe nobody reads fills after a few hundred lines (refused strangers, say), and a
        # process writing to it would stop there. hora-store itself drops log lines rather than
        # block, but it should not have to.
        for stream, sink in ((self.proc.stderr, sys.stderr), (self.proc.stdout, None)):
            threading.Thread(target=self._forward, args=(stream, sink), daemon=True,
                             name="hora-store output").start()

    @staticmethod
    def _forward(stream, sink):
        try:
            for raw in iter(stream.readline, b""):
                if sink is not None:
                    try:
                        sink.write(raw.decode("utf-8", "replace"))
                        sink.flush()
                    except (OSError, ValueError):
                        sink = None  # our own stderr is gone: keep draining
        except (OSError, ValueError):
            pass

    def exit_words(self):
        """'hora-store (pid N) exited with status S' once it has ended; None while it runs."""
        code = self.proc.poll()
        if code is None:
            return None
        what, _ = describe_exit(code)
        return "hora-store (pid %d), which served the job's store here, %s" % (self.proc.pid, what)

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
