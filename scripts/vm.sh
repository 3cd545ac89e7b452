#!/usr/bin/env bash
# vm.sh 'COMMAND': boot the guest under TCG, run COMMAND in it (cwd = the
# repo, shared at /rbln), print the console live and exit with COMMAND's exit
# status. The run fails (status 90) when the guest's kernel log shows an oops,
# WARN, BUG, panic or lockdep report, even if COMMAND succeeded, and (status
# 124) when the guest does not finish within $VM_TIMEOUT seconds.
#
# Every run attaches $VM_DEVICES (default 1) rbln-npu device models
# (target/release/rbln-npu, or $VM_NPU_BIN; started here on the host, one vfio-user socket
# each); a device model that exits with an error fails the run (status 92).
#
# Environment: VM_TIMEOUT (s, default 900), VM_SMP (default 2), VM_MEM
# (MiB, default 2048), VM_DEVICES (default 1), NPU_ARGS (extra rbln-npu
# arguments), VM_ALLOW_STACK_DUMPS=1 (bare stack dumps of failed
# allocations do not fail the run), VM_HOTPLUG=1, VM_FORWARD and
# VM_HOST_CLIENT (see below), VM_KERNEL=debug (the debug kernel
# of `make test-debug`, with the module built for it and a kmemleak check
# after COMMAND), VM_KERNEL=bench (the kernel of `make bench`: no
# lockdep; guest tests find the module built for it through RBLN_KO),
# VM_TSC_KHZ (the guest's TSC rate; see guest_clock_args),
# VM_CPU (the guest's -cpu, default max,-erms,-fsrm: see below),
# VM_KEEP=1 keeps the run directory for inspection, VM_QEMU_EXTRA (extra
# QEMU arguments, split on spaces, e.g. "-plugin /rbln/PATH.so": the repo
# is /rbln where QEMU runs).
#
# Surprise removal: a guest test makes device model i fall off the bus
# (SIGUSR1: reads return all ones, no interrupts, no DMA) by creating
# /run/rbln/unplug-npu<i>; the harness does it within 0.1 s and writes
# /run/rbln/unplugged-npu<i>. (Killing the model would abort QEMU itself:
# its vfio-user client does not survive the peer going away.)
#
# Fault injection: a guest test sends a command to device model i's debug
# control (inject PLAN, clear, status; docs/reliability.md) by writing it
# to /run/rbln/ctl-npu<i>.req (write elsewhere, then rename); the harness
# passes it on with rbln-npu-ctl and writes the reply line to
# /run/rbln/ctl-npu<i>.reply. The guest's own device interface never
# reaches this control.
#
# Hot-plug (VM_HOTPLUG=1): each NPU sits in its own PCIe root port and QEMU
# takes QMP commands. A guest test writes "del" or "add" to
# /run/rbln/hotplug-npu<i>.req: "del" is QMP device_del (the reply comes
# once QEMU reports DEVICE_DELETED, i.e. the guest let go of the device),
# "add" starts a new device model and device_adds it in the same slot.
# The reply line is in /run/rbln/hotplug-npu<i>.reply.
#
# Networking (VM_FORWARD="8000 8001"): the guest gets a virtio-net NIC on
# QEMU user networking, restricted (no route out of the guest: only the
# forwards reach it), at 10.0.2.15; each listed guest TCP port is reachable
# from the host at 127.0.0.1 on a free port the harness picks. The mapping
# is in /run/rbln/forward ("GUESTPORT 127.0.0.1:HOSTPORT" lines; the host
# side sees it as $run/forward). Servers in the guest listen on 0.0.0.0.
#
# Host client (VM_HOST_CLIENT="target/release/rbln-serve-load --addr
# http://{8001}", with VM_FORWARD): a guest test runs that host command
# with its own arguments appended by writing them (one line of words) to
# /run/rbln/host-client.req (write elsewhere, then rename); {PORT} in the
# command becomes the host address of forwarded guest port PORT. The
# command runs in the repo on the host; its stdout lands in
# /run/rbln/host-client.out, its stderr in .err and, last, its exit
# status in .rc. Only that command runs: the guest chooses its arguments,
# not the program. (Clients on the host's own cores, not on the guest's
# emulated ones: a TCG guest runs a client tens of times slower.)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VM_TIMEOUT=${VM_TIMEOUT:-900}
VM_SMP=${VM_SMP:-2}
# The guest's CPU model: QEMU's "max" without ERMS and FSRM. With them,
# glibc's memcpy and the kernel's copies use `rep movsb`, which TCG
# emulates a byte at a time; without them they use vector or 8-byte moves.
# Measured (bench kernel, alternated runs): rbln-run --async on a 16 MiB
# in, 16 MiB out Relu 10.7 -> 19.6-21.0 inferences/s.
VM_CPU=${VM_CPU:-max,-erms,-fsrm}
VM_MEM=${VM_MEM:-2048}
VM_DEVICES=${VM_DEVICES:-1}
VM_HOTPLUG=${VM_HOTPLUG:-0}
VM_KERNEL=${VM_KERNEL:-}
VM_FORWARD=${VM_FORWARD:-}
VM_HOST_CLIENT=${VM_HOST_CLIENT:-}
GUEST_IP=10.0.2.15
NPU_BIN=${VM_NPU_BIN:-$RBLN_ROOT/target/release/rbln-npu}
NPU_PIDS=()

# Kernel log lines (they start with a printk timestamp) that mean the
# kernel is unhealthy. User-space output cannot match: it has no timestamp.
BAD_KERNEL_LOG='^\[ *[0-9]+\.[0-9]+\] .*(Oops|BUG:|WARNING:|Kernel panic|kernel BUG|general protection fault|Call Trace:|possible circular locking|possible recursive locking|inconsistent lock state|suspicious RCU usage|DEBUG_LOCKS_WARN_ON|INFO: lockdep is turned off|sleeping function called from invalid context|soft lockup|hard LOCKUP|blocked for more than|rcu_.*detected stall|refcount_t:|list_(add|del) corruption|UBSAN|KASAN|panicked at|RUST_PANIC)'

# QEMU's vfio-user client warns at every boot that it cannot enable PCIe
# error recovery (AER) for the device; harmless, so it is not echoed (it
# stays in console.log).
QEMU_NOISE='Could not enable error recovery for the device'

qemu_args() {
    local initrd_name=$1
    printf '%s\n' \
        ${VM_QEMU_EXTRA:-} -accel tcg,thread=multi -cpu "$VM_CPU" -smp "$VM_SMP" -m "$VM_MEM" \
        -object "memory-backend-memfd,id=mem,size=${VM_MEM}M,share=on" \
        -machine q35,memory-backend=mem \
        -nodefaults -no-reboot -display none -serial stdio -monitor none -nic none \
        -kernel /build/bzImage -initrd "/initrd/$initrd_name" \
        -append "console=ttyS0 loglevel=5 oops=panic panic=-1 random.trust_cpu=on$(guest_clock_args)${VM_FORWARD:+ ip=$GUEST_IP::10.0.2.2:255.255.255.0::eth0:off}" \
        -device virtio-rng-pci \
        -virtfs local,path=/rbln,mount_tag=rbln,security_model=none,id=rbln \
        -virtfs local,path=/run/rbln,mount_tag=rblnrun,security_model=none,id=rblnrun
    local i
    if [[ -n $VM_FORWARD ]]; then
        local fwd="" guest host
        while read -r guest host; do
            fwd+=",hostfwd=tcp:$host-$GUEST_IP:$guest"
        done <"$run/forward"
        # restrict=on: the guest reaches nothing outside; forwards still work.
        printf '%s\n' -netdev "user,id=net0,restrict=on$fwd" -device virtio-net-pci,netdev=net0
    fi
    if ((VM_HOTPLUG)); then
        # Native PCIe hot-plug (the guest's pciehp), not QEMU's ACPI one.
        printf '%s\n' -qmp unix:/run/rbln/qmp.sock,server=on,wait=off \
            -global ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off
    fi
    for ((i = 0; i < VM_DEVICES; i++)); do
        if ((VM_HOTPLUG)); then
            printf '%s\n' -device "pcie-root-port,id=rp$i,bus=pcie.0,chassis=$((i + 1)),slot=0" \
                -device "$(npu_device_json "$i" "/run/rbln/npu$i.sock")"
        else
            printf '%s\n' -device \
                "{\"driver\":\"vfio-user-pci\",\"socket\":{\"path\":\"/run/rbln/npu$i.sock\",\"type\":\"unix\"}}"
        fi
    done
}

# Kernel arguments that give the guest the host's TSC as its clock. Under
# TCG the guest reads the host's TSC, but calibrating it against the PIT
# fails whenever the host is busy at boot ("Unable to calibrate against
# PIT"); the guest then runs on refined-jiffies: every clock read and timer
# moves in 4 ms steps (sleeps, timeouts, latencies), and ticks lost under
# load make it run slow. Given the rate (the host kernel's own calibration,
# from its log; VM_TSC_KHZ overrides, 0 disables) the guest always uses
# the TSC. Only for an invariant TSC the host itself keeps time with.
guest_clock_args() {
    local khz=${VM_TSC_KHZ:-}
    if [[ -z $khz ]]; then
        local flags mhz
        flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
        [[ $flags == *" constant_tsc "* && $flags == *" nonstop_tsc "* ]] || return 0
        [[ $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) == tsc ]] || return 0
        mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Refined TSC clocksource calibration: \([0-9.]*\) MHz.*/\1/p' | tail -1)
        [[ -n $mhz ]] || mhz=$(dmesg 2>/dev/null | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz processor.*/\1/p' | tail -1)
        [[ $mhz =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 0
        khz=$(awk -v m="$mhz" 'BEGIN { printf "%d", m * 1000 }')
    fi
    [[ $khz =~ ^[0-9]+$ ]] || die "VM_TSC_KHZ: '$khz' is not a number of kHz"
    ((khz > 0)) || return 0
    printf ' tsc_early_khz=%s tsc=reliable clocksource=tsc' "$khz"
}

# The QEMU device of hot-pluggable NPU I on the vfio-user socket SOCK.
npu_device_json() {
    printf '{"driver":"vfio-user-pci","id":"npu%s","bus":"rp%s","socket":{"path":"%s","type":"unix"}}' "$1" "$1" "$2"
}

# QMP through the sysroot's python3 (scripts/qmp.py); prints its reply.
qmp() {
    SYSROOT_BINDS="$run:/run/rbln" in_sysroot python3 /rbln/scripts/qmp.py /run/rbln/qmp.sock "$@" 2>&1 | tail -1
}

# Serve a hot-plug request for NPU I, "del" or "add"; prints the reply
# line. (In the watcher: a device model started here is recorded in
# $run/added-pids for stop_devices.)
hotplug() {
    local i=$1 what=$2 gen sock tries=0
    case $what in
        del) qmp device_del "{\"id\":\"npu$i\"}" --wait-event "DEVICE_DELETED:npu$i" --timeout 60 ;;
        add)
            gen=$(date +%s%N)
            sock=$run/npu$i.$gen.sock
            "$NPU_BIN" --socket "$sock" --control "$run/npu$i.ctl" --log-level "${NPU_LOG:-info}" ${NPU_ARGS:-} \
                >"$run/npu$i.$gen.log" 2>&1 &
            NPU_PIDS[i]=$!
            echo "$! $run/npu$i.$gen.log" >>"$run/added-pids"
            until [[ -S $sock ]]; do
                kill -0 "${NPU_PIDS[i]}" 2>/dev/null || { echo "error: the device model exited at start"; return; }
                ((++tries < 100)) || { echo "error: the device model did not create its socket"; return; }
                sleep 0.05
            done
            qmp device_add "$(npu_device_json "$i" "/run/rbln/npu$i.$gen.sock")"
            ;;
        *) echo "error: unknown hot-plug request '$what' (del, add)" ;;
    esac
}

# Pick a free host port on 127.0.0.1 for each guest port of VM_FORWARD;
# writes $run/forward.
plan_forwards() {
    local run=$1 port
    : >"$run/forward"
    [[ -n $VM_FORWARD ]] || return 0
    for port in $VM_FORWARD; do
        [[ $port =~ ^[0-9]+$ ]] && ((port > 0 && port < 65536)) || die "VM_FORWARD: '$port' is not a TCP port"
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print("'"$port"'", "127.0.0.1:%d" % s.getsockname()[1])' \
            >>"$run/forward" || die "no free host port for guest port $port"
    done
}

# Serve one host-client request (see the header): VM_HOST_CLIENT with the
# forwarded addresses filled in and the guest's words appended.
host_client() {
    local run=$1 cmd guest host
    local -a words
    read -r -a words <"$run/host-client.req" || true
    rm -f "$run/host-client.req"
    cmd=$VM_HOST_CLIENT
    while read -r guest host; do cmd=${cmd//\{$guest\}/$host}; done <"$run/forward"
    local rc=0
    # shellcheck disable=SC2086 # the command's words
    # Bounded like the guest's wait for it (a hung client must not hang
    # the harness's watcher).
    (cd "$RBLN_ROOT" && exec timeout -k 5 600 $cmd "${words[@]}") >"$run/host-client.out.tmp" 2>"$run/host-client.err.tmp" || rc=$?
    mv "$run/host-client.out.tmp" "$run/host-client.out"
    mv "$run/host-client.err.tmp" "$run/host-client.err"
    echo "$rc" >"$run/host-client.rc.tmp"
    mv "$run/host-client.rc.tmp" "$run/host-client.rc"
}

# Start the device models on the host; their sockets appear in the run
# directory, which the chroot sees as /run/rbln.
start_devices() {
    local run=$1 i
    ((VM_DEVICES == 0)) && return
    [[ -x $NPU_BIN ]] || die "$NPU_BIN is missing: run 'make host' (cargo build --release)"
    for ((i = 0; i < VM_DEVICES; i++)); do
        # shellcheck disable=SC2086
        "$NPU_BIN" --socket "$run/npu$i.sock" --control "$run/npu$i.ctl" --log-level "${NPU_LOG:-info}" ${NPU_ARGS:-} \
            >"$run/npu$i.log" 2>&1 &
        NPU_PIDS+=($!)
    done
    for ((i = 0; i < VM_DEVICES; i++)); do
        local tries=0
        until [[ -S $run/npu$i.sock ]]; do
            kill -0 "${NPU_PIDS[i]}" 2>/dev/null || { cat "$run/npu$i.log" >&2; die "rbln-npu $i exited at start"; }
            ((++tries < 100)) || die "rbln-npu $i did not create its socket"
            sleep 0.05
        done
    done
}

# Serve the guest's unplug-npu<i> and ctl-npu<i>.req requests (see the
# header) until killed.
watch_guest_requests() {
    local run=$1 i cmd
    while sleep 0.1; do
        if [[ -n $VM_HOST_CLIENT && -e $run/host-client.req ]]; then
            host_client "$run"
        fi
        for ((i = 0; i < VM_DEVICES; i++)); do
            if [[ -e $run/unplug-npu$i && ! -e $run/unplugged-npu$i ]]; then
                kill -USR1 "${NPU_PIDS[i]}" 2>/dev/null || true
                : >"$run/unplugged-npu$i"
            fi
            if [[ -e $run/ctl-npu$i.req ]]; then
                cmd=$(cat "$run/ctl-npu$i.req")
                rm -f "$run/ctl-npu$i.req"
                # shellcheck disable=SC2086 # the command's words
                "$NPU_BIN-ctl" "$run/npu$i.ctl" $cmd >"$run/ctl-npu$i.reply.tmp" 2>&1 || true
                mv "$run/ctl-npu$i.reply.tmp" "$run/ctl-npu$i.reply"
            fi
            if [[ -e $run/hotplug-npu$i.req ]]; then
                cmd=$(cat "$run/hotplug-npu$i.req")
                rm -f "$run/hotplug-npu$i.req"
                hotplug "$i" "$cmd" >"$run/hotplug-npu$i.reply.tmp" 2>&1
                mv "$run/hotplug-npu$i.reply.tmp" "$run/hotplug-npu$i.reply"
            fi
        done
    done
}

# After QEMU is gone the device models exit by themselves (client
# disconnected). Returns non-zero if one failed or had to be killed.
stop_devices() {
    local run=$1 i rc=0 pid
    for ((i = 0; i < ${#NPU_PIDS[@]}; i++)); do
        pid=${NPU_PIDS[i]}
        local tries=0
        while kill -0 "$pid" 2>/dev/null && ((tries++ < 50)); do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "rbln-npu $i did not exit after QEMU disconnected; killing it"
            kill -TERM "$pid" 2>/dev/null || true
            rc=1
        fi
        local st=0
        wait "$pid" || st=$?
        if ((st != 0)); then
            log "rbln-npu $i exited with status $st; its log:"
            sed 's/^/    /' "$run/npu$i.log" >&2
            rc=1
        fi
    done
    NPU_PIDS=()
    # Device models hot-added by the watcher (not our children: no exit
    # status; a panic shows in the log).
    local log
    while read -r pid log; do
        local tries=0
        while kill -0 "$pid" 2>/dev/null && ((tries++ < 50)); do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "hot-added rbln-npu $pid did not exit after QEMU disconnected; killing it"
            kill -TERM "$pid" 2>/dev/null || true
            rc=1
        fi
        if grep -q "panicked" "$log"; then
            log "hot-added rbln-npu $pid panicked; its log:"
            sed 's/^/    /' "$log" >&2
            rc=1
        fi
    done < <(cat "$run/added-pids" 2>/dev/null)
    return $rc
}

main() {
    local cmd=${1:-}
    [[ -n $cmd ]] || die "usage: vm.sh 'COMMAND'   (make vm CMD='...')"
    local kdir initrd run
    kdir=$(KERNEL_FLAVOR=$VM_KERNEL "$RBLN_ROOT/scripts/build-kernel.sh")
    initrd=$("$RBLN_ROOT/scripts/build-initramfs.sh")
    mkdir -p "$RBLN_CACHE/run"
    run=$(mktemp -d "$RBLN_CACHE/run/vm.XXXXXX")
    trap 'for p in "${NPU_PIDS[@]}" ${WATCHER:-}; do kill -TERM "$p" 2>/dev/null || true; done; [[ ${VM_KEEP:-0} == 1 ]] || rm -rf "$run"' EXIT
    # A kernel flavor's guest tests find the module built for it
    # (scripts/build-kmd.sh) through RBLN_KO; the debug kernel's runs also
    # fail on any leak kmemleak reports after the command.
    # RBLN_VM_SMP: the vCPUs QEMU is given (tests/vm/boot.sh checks that
    # the guest kernel brought them all up).
    local head="set -e\nexport RBLN_VM_SMP=$VM_SMP\n" tail=''
    [[ -z $VM_KERNEL ]] || head+="export RBLN_KO=target/kmd-$VM_KERNEL/kmd/rbln.ko\n"
    if [[ $VM_KERNEL == debug ]]; then
        head+='sh tests/vm-debug/kmemleak.sh start\n'
        tail='sh tests/vm-debug/kmemleak.sh check\n'
    fi
    printf "$head%s\n$tail" "$cmd" >"$run/cmd.sh"
    [[ -z $VM_HOST_CLIENT || -n $VM_FORWARD ]] || die "VM_HOST_CLIENT needs VM_FORWARD (the ports it reaches)"
    plan_forwards "$run"
    start_devices "$run"
    watch_guest_requests "$run" &
    WATCHER=$!

    log "booting the guest (TCG, ${VM_SMP} vCPUs, ${VM_MEM} MiB, ${VM_DEVICES} NPU(s), timeout ${VM_TIMEOUT}s)"
    local -a args
    mapfile -t args < <(run=$run qemu_args "$(basename "$initrd")")
    local qrc=0
    SYSROOT_BINDS="$kdir:/build $(dirname "$initrd"):/initrd $run:/run/rbln" \
        in_sysroot timeout -k 5 "$VM_TIMEOUT" qemu-system-x86_64 "${args[@]}" \
        </dev/null 2>&1 | tee "$run/console.log" | grep --line-buffered -v "$QEMU_NOISE" || qrc=${PIPESTATUS[0]}

    kill -TERM "$WATCHER" 2>/dev/null || true
    wait "$WATCHER" 2>/dev/null || true
    local devices_ok=1
    stop_devices "$run" || devices_ok=0
    if [[ $qrc == 124 || $qrc == 137 ]]; then
        log "guest did not finish within ${VM_TIMEOUT}s: killed (raise VM_TIMEOUT if the work is legitimately slow)"
        exit 124
    fi
    local bad pattern=$BAD_KERNEL_LOG
    # Allocation-failure injection makes the kernel dump the stack of each
    # failed allocation (warn_alloc: "Call Trace:" without a WARNING, BUG
    # or Oops line); VM_ALLOW_STACK_DUMPS=1 lets those through, nothing else.
    [[ ${VM_ALLOW_STACK_DUMPS:-0} != 1 ]] || pattern=${pattern//|Call Trace:/}
    bad=$(cat "$run/console.log" "$run/dmesg.txt" 2>/dev/null | tr -d '\r' | grep -E "$pattern" | head -20 || true)
    if [[ -n $bad ]]; then
        log "the guest kernel log shows a problem; failing the run:"
        printf '    %s\n' "$bad" >&2
        exit 90
    fi
    if ((devices_ok == 0)); then
        log "a device model failed; failing the run"
        exit 92
    fi
    if [[ ! -f $run/exit-code ]]; then
        log "the guest stopped without reporting an exit status (qemu status $qrc)"
        exit 91
    fi
    local rc
    rc=$(cat "$run/exit-code")
    log "guest command exited with status $rc"
    exit "$rc"
}

main "$@"
