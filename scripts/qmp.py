"""Send one QMP command to QEMU and print its answer (the harness's
hot-plug relay, scripts/vm.sh; runs with the sysroot's python3).

    qmp.py SOCKET COMMAND [JSON-ARGUMENTS] [--wait-event NAME[:DEVICE-ID]] [--timeout S]

Prints "ok <return value as JSON>" and exits 0, or "error: <why>" and
exits 1. With --wait-event, also waits (after a successful command) for
that QMP event, for the given device id if one is named.
"""

import json
import socket
import sys
import time


def main(argv):
    args = list(argv)
    wait_event, timeout = None, 30.0
    if "--wait-event" in args:
        i = args.index("--wait-event")
        wait_event = args[i + 1]
        del args[i:i + 2]
    if "--timeout" in args:
        i = args.index("--timeout")
        timeout = float(args[i + 1])
        del args[i:i + 2]
    if len(args) not in (2, 3):
        print("error: usage: qmp.py SOCKET COMMAND [JSON-ARGUMENTS] [--wait-event NAME[:ID]] [--timeout S]")
        return 1
    path, command = args[0], args[1]
    arguments = json.loads(args[2]) if len(args) == 3 else {}
    deadline = time.monotonic() + timeout
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    f = s.makefile("rw", encoding="utf-8", newline="\n")

    def send(cmd, arguments=None):
        msg = {"execute": cmd}
        if arguments:
            msg["arguments"] = arguments
        f.write(json.dumps(msg) + "\n")
        f.flush()

    events = []

    def reply():
        # Events may arrive before the command's answer; keep them.
        while True:
            line = f.readline()
            if not line:
                raise ConnectionError("QEMU closed the QMP connection")
            m = json.loads(line)
            if "event" in m:
                events.append(m)
            elif "return" in m or "error" in m:
                return m

    json.loads(f.readline())  # greeting
    send("qmp_capabilities")
    reply()
    send(command, arguments)
    r = reply()
    if "error" in r:
        print(f"error: {command}: {r['error'].get('desc', r['error'])}")
        return 1
    if wait_event:
        name, _, dev = wait_event.partition(":")

        def matches(e):
            return e["event"] == name and (not dev or e.get("data", {}).get("device") == dev)

        while not any(matches(e) for e in events):
            s.settimeout(max(0.1, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                print(f"error: no {wait_event} event within {timeout:.0f} s")
                return 1
            line = f.readline()
            if not line:
                print("error: QEMU closed the QMP connection")
                return 1
            m = json.loads(line)
            if "event" in m:
                events.append(m)
    print("ok " + json.dumps(r["return"]))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError, ConnectionError) as e:
        print(f"error: {e}")
        sys.exit(1)
