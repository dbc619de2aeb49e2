#!/usr/bin/env python3
"""emu_rewrite: turns the CUDA backend's .cu files into C++ for the CPU emulation (cuda_emu.h).

    emu_rewrite.py OUT_DIR file.cu...   ->   OUT_DIR/file.cc for each

The one construct C++ lacks is the launch: `k<<<grid, block, smem, stream>>>(a, b);` becomes
`{ (void)(smem); (void)(stream); auto emu_a0 = (a); auto emu_a1 = (b);
   emu_launch(grid, block, [=] { k(emu_a0, emu_a1); }); }`: the arguments are evaluated at the
launch, as CUDA does (a captured launch keeps them), the shared-memory size and the stream do
nothing (kernels use static shared memory; the emulation runs in stream order).
A #line directive keeps compiler messages and debugger lines pointing at the .cu file."""
import os
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_]\w*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", re.S)


def split_top(s):
    """Splits on commas outside parentheses and brackets."""
    depth, parts, cur = 0, [], ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def rewrite(m):
    cfg = split_top(m.group(2))
    unused = "".join("(void)(%s); " % c for c in cfg[2:])  # evaluated, as the launch would
    # the arguments are evaluated at the launch, as CUDA does (a captured launch keeps them)
    args = [a for a in split_top(m.group(3)) if a]
    bind = "".join("auto emu_a%d = (%s); " % (i, a) for i, a in enumerate(args))
    names = ", ".join("emu_a%d" % i for i in range(len(args)))
    return "{ %s%semu_launch(%s, %s, [=] { %s(%s); }); }" % (unused, bind, cfg[0], cfg[1],
                                                            m.group(1), names)


def main():
    out = sys.argv[1]
    for path in sys.argv[2:]:
        with open(path) as f:
            src = f.read()
        text, n = LAUNCH.subn(rewrite, src)
        if "<<<" in text:
            sys.exit("emu_rewrite: %s: a launch it cannot parse" % path)
        name = os.path.splitext(os.path.basename(path))[0] + ".cc"
        with open(os.path.join(out, name), "w") as f:
            f.write('#line 1 "%s"\n%s' % (os.path.abspath(path), text))


if __name__ == "__main__":
    main()
