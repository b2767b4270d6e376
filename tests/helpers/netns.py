"""Hosts of an emulated cluster on this machine: one Linux network namespace per host (root only).

A network is a bridge in the root namespace (the gateway, ``10.231.X.1``) and one namespace per
host, ``<prefix>-<name>``, joined to the bridge by a veth pair, with an address of its own, its own
``/etc/hosts`` (``ip netns exec`` mounts ``/etc/netns/<namespace>/hosts``) and a private local
directory. Every process of a host runs under :meth:`Network.command`: a UTS namespace with the
host's name, and a mount namespace where the host's own directory is mounted on ``local_dir``
(the same path on every host) and every host's backing directory is hidden under an empty tmpfs,
so a file one host writes there is seen by no other host and not by the root namespace.

A host fault is every process of its namespace killed at once (:meth:`Network.kill_host`), its
link set down (:meth:`Network.cut_link`, :meth:`Network.restore_link`: sockets fail fast), or its
packets dropped on the bridge (:meth:`Network.black_hole`, :meth:`Network.end_black_hole`: an nft
table of the bridge family; sockets hang, its processes live on). The state file, written
before anything is created, lets :func:`destroy` remove a network by its name after a crash;
:func:`reap_orphans` removes the networks whose owning process has died.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

# A /16 that only these namespaces use; each network takes the first /24 of it that no address or
# route on this machine overlaps.
PRIVATE_RANGE = ipaddress.IPv4Network("10.231.0.0/16")
STATE_ROOT = Path("/run/kafka2pc-netns")
IFNAMSIZ = 15  # the kernel's longest interface name
KILL_TIMEOUT_S = 10.0


class NetnsError(RuntimeError):
    pass


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str
    veth: str  # the end in the root namespace, on the bridge: set it down to cut the host off
    private_dir: Path  # where the host's local files really are; hidden from every host
    local_dir: Path  # where the host's processes see them


@dataclass(frozen=True)
class Network:
    prefix: str
    bridge: str
    gateway: str  # the bridge's address: the root namespace as every host reaches it
    hosts: tuple[Host, ...]
    directory: Path

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise NetnsError(f"no host {name!r} in network {self.prefix} (hosts: {', '.join(self.names)})")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.hosts)

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as a process of host ``name``: its network, hostname and private directory."""
        h = self.host(name)
        script = (
            'hostname "$0" && mount --bind "$1" "$2" && mount -t tmpfs -o size=64k hidden "$3" && shift 3 && exec "$@"'
        )
        wrap = ["ip", "netns", "exec", h.netns, "unshare", "--uts", "--mount", "--propagation", "private"]
        return [
            *wrap,
            "sh",
            "-c",
            script,
            h.name,
            str(h.private_dir),
            str(h.local_dir),
            str(_private_root(self)),
            *argv,
        ]

    def run(self, name: str, argv: Sequence[str], timeout: float = 30.0) -> str:
        """Run a short command on a host; its stdout."""
        return _run(self.command(name, argv), timeout=timeout)

    def pids(self, name: str) -> list[int]:
        return _netns_pids(self.host(name).netns)

    def kill_host(self, name: str) -> int:
        """SIGKILL every process of the host at once (a host that loses power); how many were killed."""
        return _kill_netns(self.host(name).netns)

    def cut_link(self, name: str) -> None:
        _run(["ip", "link", "set", self.host(name).veth, "down"])

    def restore_link(self, name: str) -> None:
        _run(["ip", "link", "set", self.host(name).veth, "up"])

    def black_hole(self, name: str) -> None:
        """Drop every packet to and from the host on the bridge, silently: its sockets hang (no
        refusal, no unreachable), as in a partition or a frozen VM; its processes live on."""
        table = _hole_table(self.host(name))
        _run(["nft", "add", "table", "bridge", table])
        for hook in ("forward", "input", "output"):
            _run(["nft", "add", "chain", "bridge", table, hook, f"{{ type filter hook {hook} priority -200 ; }}"])
            for direction in ("iifname", "oifname"):
                _run(["nft", "add", "rule", "bridge", table, hook, direction, self.host(name).veth, "drop"])

    def end_black_hole(self, name: str) -> None:
        _run(["nft", "delete", "table", "bridge", _hole_table(self.host(name))], check=False)

    def destroy(self) -> None:
        destroy(self.prefix)


def _hole_table(host: Host) -> str:
    return f"{host.veth.replace('-', '_')}_hole"


def _private_root(network: Network) -> Path:
    return network.directory / "private"


def _run(argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> str:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def _state_file(prefix: str) -> Path:
    return STATE_ROOT / f"{prefix}.json"


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks since boot


@contextmanager
def _lock() -> Iterator[None]:
    # Two starters must not pick the same /24 or names.
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with (STATE_ROOT / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _free_subnet() -> ipaddress.IPv4Network:
    taken = []
    for line in _run(["ip", "-4", "-o", "addr"]).splitlines() + _run(["ip", "-4", "route"]).splitlines():
        for word in re.findall(r"\b\d+\.\d+\.\d+\.\d+(?:/\d+)?\b", line):
            taken.append(ipaddress.ip_network(word, strict=False))
    for subnet in PRIVATE_RANGE.subnets(new_prefix=24):
        if not any(subnet.overlaps(t) for t in taken):
            return subnet
    raise NetnsError(f"every /24 of {PRIVATE_RANGE} is in use on this machine: stop a cluster-local network first")


def create(prefix: str, names: Sequence[str], directory: Path, owner_pid: int | None = None) -> Network:
    """A bridge and one namespace per name; ``owner_pid``'s death makes it an orphan for :func:`reap_orphans`."""
    longest = IFNAMSIZ - len(prefix) - 1
    for name in names:
        if not re.fullmatch(r"[a-z][a-z0-9]*", name) or len(name) > longest:
            raise NetnsError(f"host name {name!r}: lower-case letters and digits, at most {longest} characters")
    with _lock():
        if _state_file(prefix).exists() or _namespaces(prefix):
            raise NetnsError(
                f"a network {prefix!r} exists already: stop it first (scripts/cluster-local stop --prefix {prefix})"
            )
        subnet = _free_subnet()
        addresses = list(subnet.hosts())
        directory = directory.resolve()
        hosts = tuple(
            Host(
                n,
                f"{prefix}-{n}",
                str(addresses[i + 1]),
                f"{prefix}-{n}",
                directory / "private" / n,
                directory / "local",
            )
            for i, n in enumerate(names)
        )
        network = Network(prefix, f"{prefix}-br", str(addresses[0]), hosts, directory)
        owner = {"owner_pid": owner_pid, "owner_start": _start_time(owner_pid) if owner_pid else None}
        state = {"prefix": prefix, "subnet": str(subnet), "directory": str(directory), **owner}
        _state_file(prefix).write_text(json.dumps(state))  # first: a crash from here on leaves a name to destroy
    try:
        _build(network, subnet)
    except BaseException:
        destroy(prefix)
        raise
    return network


def _build(network: Network, subnet: ipaddress.IPv4Network) -> None:
    br = network.bridge
    _run(["ip", "link", "add", br, "type", "bridge"])
    _run(["ip", "addr", "add", f"{network.gateway}/{subnet.prefixlen}", "dev", br])
    _run(["ip", "link", "set", br, "up"])
    (network.directory / "local").mkdir(parents=True, exist_ok=True)
    hosts_file = "127.0.0.1 localhost\n" + f"{network.gateway} gateway\n"
    hosts_file += "".join(f"{h.address} {h.name}\n" for h in network.hosts)
    for h in network.hosts:
        h.private_dir.mkdir(parents=True, exist_ok=True)
        etc = Path("/etc/netns") / h.netns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(hosts_file)
        # No name server: a lookup of an unknown name fails at once instead of timing out.
        (etc / "resolv.conf").write_text("options timeout:1 attempts:1\n")
        _run(["ip", "netns", "add", h.netns])
        _run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns])
        _run(["ip", "link", "set", h.veth, "master", br, "up"])
        _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/{subnet.prefixlen}", "dev", "eth0"])
        _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", h.netns, "route", "add", "default", "via", network.gateway])


def load(prefix: str) -> Network:
    try:
        state = json.loads(_state_file(prefix).read_text())
    except FileNotFoundError:
        raise NetnsError(f"no network {prefix!r} is running (no {_state_file(prefix)})") from None
    directory = Path(state["directory"])
    subnet = ipaddress.IPv4Network(state["subnet"])
    addresses = list(subnet.hosts())
    by_address = {}
    for ns in _namespaces(prefix):
        name = ns[len(prefix) + 1 :]
        out = _run(["ip", "-n", ns, "-4", "-o", "addr", "show", "eth0"], check=False)
        match = re.search(r"inet (\S+)/", out)
        if match:
            by_address[match.group(1)] = name
    hosts = tuple(
        Host(n, f"{prefix}-{n}", a, f"{prefix}-{n}", directory / "private" / n, directory / "local")
        for a, n in sorted(by_address.items(), key=lambda kv: ipaddress.ip_address(kv[0]))
    )
    return Network(prefix, f"{prefix}-br", str(addresses[0]), hosts, directory)


def _namespaces(prefix: str) -> list[str]:
    names = [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(f"{prefix}-"))


def _links(prefix: str) -> list[str]:
    out = _run(["ip", "-o", "link", "show"])
    names = [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", out, re.MULTILINE)]
    return [n for n in names if n.startswith(f"{prefix}-")]


def _netns_pids(netns: str) -> list[int]:
    return [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).split()]


def _kill_netns(netns: str) -> int:
    return _kill_all(lambda: _netns_pids(netns), netns)


def _kill_all(listed: Callable[[], list[int]], what: str) -> int:
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while pids := listed():  # again: a process may have forked, or entered, while we killed
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        if time.monotonic() > deadline:
            raise NetnsError(f"processes {pids} of {what} survived SIGKILL for {KILL_TIMEOUT_S:.0f}s")
        time.sleep(0.05)
    return len(killed)


def processes(prefix: str, directory: Path | None = None) -> list[int]:
    """Processes of the network: in one of its namespaces, or started into one, or naming its directory."""
    marks = [f"netns exec {prefix}-"] + ([str(directory)] if directory else [])
    found = {pid for ns in _namespaces(prefix) for pid in _netns_pids(ns)}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if any(m in cmdline for m in marks) and (entry / "exe").exists():  # not a zombie
                    found.add(int(entry.name))
    return sorted(found)


def leftovers(prefix: str, directory: Path | None = None) -> list[str]:
    """Everything of the network that still exists; empty after :func:`destroy`."""
    found = [f"namespace {n}" for n in _namespaces(prefix)]
    found += [f"link {n}" for n in _links(prefix)]
    found += [f"process {p}" for p in processes(prefix, directory)]
    found += [f"file {p}" for p in (_state_file(prefix), *Path("/etc/netns").glob(f"{prefix}-*")) if p.exists()]
    return found


def destroy(prefix: str) -> None:
    """Remove every process, namespace, veth, bridge and file of network ``prefix``, found by name
    (and the processes by namespace); idempotent, and works after the creator crashed."""
    for table in _run(["nft", "list", "tables", "bridge"], check=False).split():
        if table.startswith(prefix.replace("-", "_") + "_"):  # a black hole left in place
            _run(["nft", "delete", "table", "bridge", table], check=False)
    # Before deleting the names, and with the processes still on their way in (``ip netns exec``
    # before its setns): either would outlive the name in a nameless namespace.
    _kill_all(lambda: processes(prefix), prefix)
    for ns in _namespaces(prefix):
        _run(["ip", "netns", "delete", ns], check=False)
    for link in _links(prefix):  # a veth goes with its namespace; the bridge does not
        _run(["ip", "link", "delete", link], check=False)
    for etc in Path("/etc/netns").glob(f"{prefix}-*"):
        shutil.rmtree(etc, ignore_errors=True)
    with suppress(OSError):
        Path("/etc/netns").rmdir()  # only if no other network has files there
    _state_file(prefix).unlink(missing_ok=True)


def reap_orphans() -> list[str]:
    """Destroy the networks whose owning process has died (a test run killed before its
    finalizer); the prefixes destroyed."""
    reaped = []
    for state_file in sorted(STATE_ROOT.glob("*.json")):
        with suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
            pid = state.get("owner_pid")
            now = _start_time(pid) if pid else None
            if pid and (now is None or now != state.get("owner_start")):  # dead, or its pid reused
                destroy(state["prefix"])
                reaped.append(state["prefix"])
    return reaped


@contextmanager
def owned_network(prefix: str, names: Sequence[str], directory: Path) -> Iterator[Network]:
    """A network owned by this process (destroyed with it if it dies, by the next
    :func:`reap_orphans`), destroyed on exit; what would remain is an error."""
    reap_orphans()  # a run killed before its finalizer left its namespaces behind
    network = create(prefix, names, directory / "hosts", owner_pid=os.getpid())
    try:
        yield network
    finally:
        network.destroy()
        left = leftovers(prefix, directory)
        assert not left, f"left behind by the emulated cluster {prefix}: {left}"
