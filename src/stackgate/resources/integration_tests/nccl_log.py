"""Parse NCCL_DEBUG=INFO output (NCCL_DEBUG_SUBSYS=INIT,NET): which network, plugin and
transports NCCL chose. A pool that expects EFA and got sockets is a silent, expensive fallback."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NET_USING = re.compile(r"NET/\S*\s*:?\s*Using network\s+(AWS\s+Libfabric|Libfabric|IB|Socket|[A-Za-z_ ]+?)\s*$", re.M)
_USING_NETWORK = re.compile(r"Using network\s+(AWS Libfabric|Libfabric|IB|Socket|\w+)")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\S+?)[,\s]")
_PLUGIN_LOADED = re.compile(r"NET/Plugin:?\s*(?:Loaded net plugin|Plugin name set by env to|Loaded)\s+(\S+)")
_PLUGIN_MISSING = re.compile(r"NET/Plugin\s*:?\s*(?:No plugin found|Could not find|Failed to find|dlerror).*")
_CHANNEL = re.compile(r"Channel \d+/\d+ : \d+\[\S+\] -> \d+\[\S+\]\s*(?:\[\w+\]\s*)?via (\S+)")
_NVLS = re.compile(r"NVLS (multicast support is available|comm)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_OFI_FAIL = re.compile(r"NET/OFI.*(initialization failed|failed)", re.I)


@dataclass
class NcclTransport:
    version: str | None = None
    network: str | None = None  # efa | ib | socket | libfabric-other
    ofi_provider: str | None = None
    plugin: str | None = None
    plugin_missing: bool = False
    plugin_errors: list[str] = field(default_factory=list)
    transports: set[str] = field(default_factory=set)  # P2P, SHM, NET, NVLS, CUMEM...

    def matches(self, expected: str) -> tuple[bool, str]:
        """Does the chosen network satisfy the pool's expected transport?"""
        if expected in ("", "none"):
            return True, "no network transport expected"
        if expected == "any":  # the pool declared no expectation: record what NCCL picked, judge nothing
            return True, f"NCCL uses {self.network or 'no network (single node)'}; the pool expects any transport"
        if self.network is None:
            return False, "NCCL log shows no network selection (was NCCL_DEBUG=INFO set, did a collective run?)"
        if expected == self.network:
            return True, f"NCCL uses {self.network}" + (f" (provider {self.ofi_provider})" if self.ofi_provider else "")
        return False, (f"expected {expected} but NCCL uses {self.network}"
                       + (f" (provider {self.ofi_provider})" if self.ofi_provider else "")
                       + ("; net plugin not found" if self.plugin_missing else "")
                       + ("; " + "; ".join(self.plugin_errors[:2]) if self.plugin_errors else ""))


def parse(text: str) -> NcclTransport:
    result = NcclTransport()
    if m := _VERSION.search(text):
        result.version = m.group(1)
    if m := _OFI_PROVIDER.search(text + " "):
        result.ofi_provider = m.group(1).rstrip(",;")
    network = None
    for m in _USING_NETWORK.finditer(text):
        network = m.group(1).strip()
    if network:
        low = network.lower()
        if "libfabric" in low:
            result.network = "efa" if (result.ofi_provider or "").startswith("efa") else "libfabric"
        elif low == "ib":
            result.network = "ib"
        elif low == "socket":
            result.network = "socket"
        else:
            result.network = low
    if m := _PLUGIN_LOADED.search(text):
        result.plugin = m.group(1)
    if _PLUGIN_MISSING.search(text):
        result.plugin_missing = True
    result.plugin_errors = [m.group(0).strip() for m in _OFI_FAIL.finditer(text)]
    for m in _CHANNEL.finditer(text):
        via = m.group(1)
        result.transports.add(via.split("/")[0])
    if _NVLS.search(text):
        result.transports.add("NVLS")
    return result
