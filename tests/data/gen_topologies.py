#!/usr/bin/env python3
"""Writes gpu8.xml: a hand-made hwloc 2 XML topology of a 2-socket machine (one NUMA node
and 4 cores per socket) with 8 GPUs, two PCIe switches per socket and two GPUs per switch.
2socket.xml is hwloc's own export of
synthetic:"pack:2 [numa(memory=16GB)] l3:1(size=32MB) core:2 pu:2".
Run: python3 gen_topologies.py (in tests/data)."""

GP = [100]


def gp():
    GP[0] += 1
    return GP[0]


def sets(cpus, node):
    c = "0x%08x" % cpus
    n = "0x%08x" % node
    return (f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"')


def package(p, buses):
    cpus = 0xF << (4 * p)
    out = [f'    <object type="Package" os_index="{p}" {sets(cpus, 1 << p)} gp_index="{gp()}">',
           f'      <object type="NUMANode" os_index="{p}" {sets(cpus, 1 << p)} gp_index="{gp()}" '
           f'local_memory="68719476736"/>']
    for c in range(4):
        cs = 1 << (4 * p + c)
        out.append(f'      <object type="Core" os_index="{4 * p + c}" {sets(cs, 1 << p)} gp_index="{gp()}">')
        out.append(f'        <object type="PU" os_index="{4 * p + c}" {sets(cs, 1 << p)} gp_index="{gp()}"/>')
        out.append('      </object>')
    lo, hi = min(min(b) for b in buses) - 1, max(max(b) for b in buses)
    out.append(f'      <object type="Bridge" gp_index="{gp()}" bridge_type="0-1" depth="0" '
               f'bridge_pci="0000:[{lo:02x}-{hi:02x}]">')
    for sw in buses:
        up = min(sw) - 1
        out.append(f'        <object type="Bridge" gp_index="{gp()}" bridge_type="1-1" depth="1" '
                   f'bridge_pci="0000:[{min(sw):02x}-{max(sw):02x}]" pci_busid="0000:{up:02x}:00.0" '
                   f'pci_type="0604 [1000:c030] [0000:0000] 00" pci_link_speed="0.000000">')
        for b in sw:
            out.append(f'          <object type="PCIDev" gp_index="{gp()}" pci_busid="0000:{b:02x}:00.0" '
                       f'pci_type="0302 [10de:2330] [10de:16c1] a1" pci_link_speed="31.507692"/>')
        out.append('        </object>')
    out.append('      </object>')
    out.append('    </object>')
    return out


lines = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
         '<topology version="2.0">',
         f'  <object type="Machine" os_index="0" {sets(0xFF, 3)} allowed_cpuset="0x000000ff" '
         f'allowed_nodeset="0x00000003" gp_index="1">']
lines += package(0, [[0x19, 0x1a], [0x2b, 0x2c]])
lines += package(1, [[0x9b, 0x9c], [0xab, 0xac]])
lines += ['  </object>', '</topology>']
open("gpu8.xml", "w").write("\n".join(lines) + "\n")
