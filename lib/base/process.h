// SPDX-License-Identifier: Apache-2.0
// Facts about other processes on this host, for naming a peer that is gone.
#pragma once

#include <string>

namespace hora {

// A process that exited or is exiting: no such process, a zombie its parent has not reaped yet
// (a busy launcher, or a test harness, can leave it so for a long time), or one already inside
// the kernel's exit path. The last matters for naming a killed peer: the kernel closes a dying
// process's sockets before the process turns zombie, so a survivor's read error can arrive while
// the peer still looks alive by its state letter alone, and on a loaded host for a long time.
bool processGone(long pid);

// The same decision from the text of /proc/<pid>/stat (pure, for tests): a state of Z or X, or
// the kernel's PF_EXITING flag in the flags field. False for text it cannot parse.
bool procStatSaysGone(const std::string &stat);

// This host's name, as gethostname() gives it ("" if it fails).
std::string hostName();
// hostName(), or `fallback` where the system gives none.
std::string hostNameOr(const char *fallback);

// What makes two processes "on one host" for shared memory and for telling a lost peer by its
// pid: the host name, the kernel's boot id, the IPC and pid namespaces, as
// "name|boot id|ipc:[...]|pid:[...]". Two ranks in different containers or network-namespace
// "hosts" of one machine differ.
std::string hostIdentity();
// The host name part of a hostIdentity(), for messages.
std::string hostOfIdentity(const std::string &identity);

}  // namespace hora
