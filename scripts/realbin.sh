#!/usr/bin/env bash
# Fetches GPU binaries that nobody in this project built (NVIDIA's CUDA 11.8
# libraries from Debian non-free, CUDA-built programs from contrib, ROCm 5
# libraries from main, llama.cpp's CUDA backend from npm) and records what
# independent tools say they hold, for compat/realbin_test.go:
#
#   cuobjdump (CUDA 11.8)      SASS and PTX targets, PTX ISA versions
#   clang-offload-bundler-15   AMD GPU targets of each .hip_fatbin bundle
#
# Nothing is installed when the tools run from their unpacked packages (the
# usual case); the Debian packages are downloaded with apt-get download and
# unpacked with dpkg-deb -x into the cache. The binaries are never committed:
# see testdata/realbin/SOURCES.md for what is fetched and under which licence.
#
# Cache: ${KILN_REALBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/realbin}
#   debs/      the .deb files          root/<package>/  each one unpacked
#   npm/       npm tarballs, unpacked  tools/           cuobjdump, LLVM 15, zstd
#   truth.jsonl   one line per ELF file: what the tools say it holds
#   manifest.json packages, sizes, tools, fatbin header facts, notes
# Re-running uses the cache ("cached"); delete the directory to start over.
set -euo pipefail

CACHE="${KILN_REALBIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/realbin}"
START=$(date +%s)

# NVIDIA CUDA 11.8 libraries (non-free). A spread: SASS only (nppc), SASS
# and PTX for the newest target (curand, cufft, nvjpeg, npp*, cublas), and
# the largest one (cublasLt, 206 MB .deb, 575 MB library). cudart has no
# device code and is kept as a file that must read as empty.
NVIDIA_LIBS=(libcudart11.0 libcurand10 libcufft10 libnvjpeg11 libnppc11 libnppicc11
	libnppim11 libcublas11 libcublaslt11)
# CUDA-built programs and Python modules (contrib), built by Debian's own
# nvcc: PTX only (pyhst2), SASS + PTX of one target (bart, starpu examples),
# many targets (astra), relocatable fatbins beside the executable one
# (magma-sparse). mumax3 is a Go program that embeds PTX text outside any
# fatbin: it must read as empty.
CONTRIB_APPS=(bart-cuda python3-pyhst2-cuda starpu-contrib-examples octave-astra-toolbox
	libmagma-sparse2 mumax3)
# ROCm 5 (main). rocsparse is the largest ROCm library in bookworm (1.3 GB
# unpacked, 111 bundles); rocrand has one bundle. libamdhip64 (HIP itself)
# holds the bundle magic as a string but no device code; hipsparse and
# hiprand are host wrappers; libhsa-runtime64 embeds raw code objects
# (blit and trap kernels) outside any bundle.
ROCM_LIBS=(librocsparse0 librocrand1 libamdhip64-5 libhipsparse0 libhiprand1 libhsa-runtime64-1)
# The independent tools, unpacked into tools/.
TOOL_PKGS=(nvidia-cuda-toolkit clang-tools-15 libclang-cpp15 libllvm15 llvm-15 zstd)
# npm: llama.cpp's CUDA backend, built with CUDA 13.1 (zstd-compressed
# entries, sm_120a/sm_121a), and its fallback build with CUDA 12.4 (LZ4
# PTX, uncompressed cubins); both MIT.
NPM_SPECS=(@node-llama-cpp/linux-x64-cuda@3.22.1 @node-llama-cpp/linux-x64-cuda-ext@3.22.1)

say() { printf 'realbin: %s\n' "$*"; }
as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	else
		sudo "$@"
	fi
}
APT_DL=(apt-get -qq)
# apt's download sandbox user cannot write under root's home.
[ "$(id -u)" = 0 ] && APT_DL+=(-o APT::Sandbox::User=root)

mkdir -p "$CACHE"/{debs,root,tools,npm,state,tmp}
rm -rf "${CACHE:?}"/tmp/*

# 1. contrib and non-free.
SOURCES=/etc/apt/sources.list.d/kiln-nonfree.sources
# known PACKAGE...: every one has a candidate version (apt-cache show also
# answers for packages that are only referenced by others).
known() {
	local p
	for p in "$@"; do
		case "$(apt-cache policy "$p" 2>/dev/null)" in
		*"Candidate: "[0-9]*) ;;
		*) return 1 ;;
		esac
	done
}
if known libcudart11.0 python3-pyhst2-cuda; then
	say "apt: contrib and non-free known (cached)"
else
	if [ ! -e "$SOURCES" ]; then
		say "apt: adding $SOURCES (bookworm contrib non-free)"
		as_root tee "$SOURCES" >/dev/null <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	fi
	say "apt: apt-get update"
	as_root apt-get update -qq
	known libcudart11.0 python3-pyhst2-cuda || {
		echo "realbin: contrib/non-free packages still unknown after apt-get update" >&2
		exit 1
	}
fi

# 2. and 3. Debian packages: download, unpack.
TARGETS=("${NVIDIA_LIBS[@]}" "${CONTRIB_APPS[@]}" "${ROCM_LIBS[@]}")
deb_of() { compgen -G "$CACHE/debs/${1}_*.deb" | head -n1; }
missing=()
for p in "${TARGETS[@]}" "${TOOL_PKGS[@]}"; do
	[ -n "$(deb_of "$p")" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	say "apt-get download ${missing[*]}"
	(cd "$CACHE/tmp" && "${APT_DL[@]}" download "${missing[@]}")
	mv "$CACHE"/tmp/*.deb "$CACHE/debs/"
else
	say "debs: ${#TARGETS[@]} packages + ${#TOOL_PKGS[@]} tool packages (cached)"
fi

# unpack PACKAGE DIR: dpkg-deb -x into DIR unless that .deb already went there.
unpack() {
	local p=$1 dest=$2 deb stamp
	deb=$(deb_of "$p")
	stamp="$CACHE/state/$(basename "$dest").$p"
	if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(basename "$deb")" ]; then
		return 0
	fi
	say "unpack $(basename "$deb")"
	if [ "$dest" = "$CACHE/root/$p" ]; then
		rm -rf "$CACHE/tmp/x" "$dest"
		dpkg-deb -x "$deb" "$CACHE/tmp/x"
		mv "$CACHE/tmp/x" "$dest"
	else
		mkdir -p "$dest"
		dpkg-deb -x "$deb" "$dest"
	fi
	basename "$deb" >"$stamp"
}
n_unpacked=$(find "$CACHE/state" -maxdepth 1 -type f | wc -l)
for p in "${TARGETS[@]}"; do unpack "$p" "$CACHE/root/$p"; done
unpack nvidia-cuda-toolkit "$CACHE/tools/cuda"
for p in clang-tools-15 libclang-cpp15 libllvm15 llvm-15; do unpack "$p" "$CACHE/tools/llvm-15"; done
unpack zstd "$CACHE/tools/zstd"
[ "$(find "$CACHE/state" -maxdepth 1 -type f | wc -l)" = "$n_unpacked" ] && say "unpacked trees (cached)"

# The tools, run from the cache; installed only if they cannot run there.
CUOBJDUMP="$CACHE/tools/cuda/usr/bin/cuobjdump"
if ! "$CUOBJDUMP" --version >/dev/null 2>&1; then
	say "cuobjdump does not run unpacked: installing nvidia-cuda-toolkit"
	as_root apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit
	CUOBJDUMP=$(command -v cuobjdump)
fi
LLVM="$CACHE/tools/llvm-15"
# The unpacked LLVM tools find their libraries through this path only.
LLVM_LIBS="$LLVM/usr/lib/llvm-15/lib:$LLVM/usr/lib/x86_64-linux-gnu"
BUNDLER="$LLVM/usr/lib/llvm-15/bin/clang-offload-bundler"
OBJCOPY="$LLVM/usr/lib/llvm-15/bin/llvm-objcopy"
READOBJ="$LLVM/usr/lib/llvm-15/bin/llvm-readobj"
llvm_ok() {
	LD_LIBRARY_PATH="$LLVM_LIBS" "$BUNDLER" --version >/dev/null 2>&1 &&
		LD_LIBRARY_PATH="$LLVM_LIBS" "$OBJCOPY" --version >/dev/null 2>&1
}
if ! llvm_ok; then
	# LLVM 15's own libraries are unpacked; what can be missing on a bare
	# machine are their dependencies (libz3, libedit, libxml2 ...).
	say "LLVM 15 does not run unpacked: installing libllvm15 libclang-cpp15 (its dependencies)"
	as_root apt-get install -y -qq --no-install-recommends libllvm15 libclang-cpp15
	if ! llvm_ok; then
		say "installing clang-tools-15 llvm-15"
		as_root apt-get install -y -qq --no-install-recommends clang-tools-15 llvm-15
		BUNDLER=$(command -v clang-offload-bundler-15)
		OBJCOPY=$(command -v llvm-objcopy-15)
		READOBJ=$(command -v llvm-readobj-15)
	fi
fi
ZSTD="$CACHE/tools/zstd/usr/bin/zstd"
"$ZSTD" --version >/dev/null 2>&1 || ZSTD=$(command -v zstd || true)
command -v python3 >/dev/null 2>&1 || as_root apt-get install -y -qq --no-install-recommends python3

# 4. npm packages.
NPM_DONE=()
for spec in "${NPM_SPECS[@]}"; do
	name=${spec%@*}
	ver=${spec##*@}
	base=${name#@}
	base=${base//\//-}-$ver
	tgz="$CACHE/npm/$base.tgz"
	if [ -d "$CACHE/npm/$base" ]; then
		say "npm: $spec (cached)"
		NPM_DONE+=("$spec")
		continue
	fi
	if ! command -v npm >/dev/null 2>&1; then
		say "npm not found: $spec skipped" >&2
		continue
	fi
	if [ ! -f "$tgz" ]; then
		say "npm pack $spec"
		(cd "$CACHE/tmp" && npm pack --silent --json "$spec" >"$CACHE/npm/$base.pack.json")
		mv "$CACHE/tmp/$base.tgz" "$tgz"
	fi
	rm -rf "$CACHE/tmp/npm"
	mkdir -p "$CACHE/tmp/npm"
	tar -xzf "$tgz" -C "$CACHE/tmp/npm"
	mv "$CACHE/tmp/npm" "$CACHE/npm/$base"
	NPM_DONE+=("$spec")
done

# 5. Ground truth.
export CACHE CUOBJDUMP BUNDLER OBJCOPY READOBJ ZSTD LLVM_LIBS
export REALBIN_TARGETS="${TARGETS[*]}" REALBIN_NPM="${NPM_DONE[*]}" REALBIN_START="$START"
python3 - <<'PY'
import concurrent.futures as cf
import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time

CACHE = os.environ["CACHE"]
CUOBJDUMP, BUNDLER = os.environ["CUOBJDUMP"], os.environ["BUNDLER"]
OBJCOPY, READOBJ, ZSTD = os.environ["OBJCOPY"], os.environ["READOBJ"], os.environ["ZSTD"]
TARGETS = os.environ["REALBIN_TARGETS"].split()
NPM = os.environ["REALBIN_NPM"].split()
# Bumped when what goes into truth.jsonl changes.
GENERATOR = "realbin-truth-4"


LLVM_ENV = dict(os.environ, LD_LIBRARY_PATH=os.environ["LLVM_LIBS"])


def run(args, **kw):
    if args[0] in (BUNDLER, OBJCOPY, READOBJ):
        kw["env"] = LLVM_ENV
    return subprocess.run(args, capture_output=True, **kw)


def tool_version(args, pattern):
    out = run(args).stdout.decode(errors="replace")
    m = re.search(pattern, out)
    return m.group(1) if m else "?"


CUOBJDUMP_V = tool_version([CUOBJDUMP, "--version"], r"V(\d+\.\d+\.\d+)")
BUNDLER_V = tool_version([BUNDLER, "--version"], r"version (\d+\.\d+\.\d+)")
ZSTD_V = tool_version([ZSTD, "--version"], r"v(\d+\.\d+\.\d+)") if ZSTD else "none"
T_CUOBJDUMP = "cuobjdump " + CUOBJDUMP_V
T_BUNDLER = "clang-offload-bundler-15"
T_PAYLOAD = "fatbin payload decode"


def deb_field(deb, field):
    return run(["dpkg-deb", "-f", deb, field]).stdout.decode().strip()


def du(path):
    total = 0
    for dp, _, fns in os.walk(path):
        for fn in fns:
            p = os.path.join(dp, fn)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


# --- what was fetched -------------------------------------------------------
packages = []
debs = sorted(os.listdir(os.path.join(CACHE, "debs")))
for pkg in TARGETS:
    deb = next(d for d in debs if d.startswith(pkg + "_"))
    debp = os.path.join(CACHE, "debs", deb)
    section = deb_field(debp, "Section")
    packages.append({
        "package": pkg, "version": deb_field(debp, "Version"),
        "source": "debian bookworm " + (section.split("/")[0] if "/" in section else "main"),
        "deb": deb, "deb_bytes": os.path.getsize(debp), "root": "root/" + pkg,
        "unpacked_bytes": du(os.path.join(CACHE, "root", pkg)),
    })
for spec in NPM:
    name, ver = spec.rsplit("@", 1)
    base = name.lstrip("@").replace("/", "-") + "-" + ver
    info = {}
    try:
        with open(os.path.join(CACHE, "npm", base + ".pack.json")) as f:
            info = json.load(f)[0]
    except (OSError, ValueError, IndexError):
        pass
    packages.append({
        "package": name, "version": ver, "source": "npm", "tarball": "npm/" + base + ".tgz",
        "deb_bytes": os.path.getsize(os.path.join(CACHE, "npm", base + ".tgz")),
        "shasum": info.get("shasum", ""), "integrity": info.get("integrity", ""),
        "root": "npm/" + base, "unpacked_bytes": du(os.path.join(CACHE, "npm", base)),
    })

tool_debs = [d for d in debs if not any(d.startswith(p + "_") for p in TARGETS)]
key_src = json.dumps([GENERATOR, [(p["package"], p["version"]) for p in packages], tool_debs,
                      CUOBJDUMP_V, BUNDLER_V, ZSTD_V]).encode()
key = hashlib.sha256(key_src).hexdigest()
truth_path = os.path.join(CACHE, "truth.jsonl")
key_path = os.path.join(CACHE, "state", "truth.key")
if os.path.exists(truth_path) and os.path.exists(key_path) and open(key_path).read() == key:
    n = sum(1 for _ in open(truth_path))
    print(f"realbin: truth.jsonl: {n} files (cached)")
    with open(os.path.join(CACHE, "manifest.json")) as f:
        manifest = json.load(f)
    cached = True
else:
    cached = False


# --- ELF --------------------------------------------------------------------
def elf_sections(path):
    """{name: (offset, size)} of a little-endian ELF64 file, or None."""
    with open(path, "rb") as f:
        h = f.read(64)
        if len(h) < 64 or h[:4] != b"\x7fELF" or h[4] != 2 or h[5] != 1:
            return None
        shoff, = struct.unpack_from("<Q", h, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", h, 0x3A)
        if shoff == 0 or shnum == 0 or shstrndx >= shnum:
            return {}
        f.seek(shoff)
        sh = f.read(shentsize * shnum)
        secs = [struct.unpack_from("<IIQQQQ", sh, i * shentsize) for i in range(shnum)]
        st = secs[shstrndx]
        f.seek(st[4])
        names = f.read(st[5])
    out = {}
    for s in secs:
        end = names.find(b"\0", s[0])
        out[names[s[0]:end].decode(errors="replace")] = (s[4], s[5])
    return out


def soname(path):
    out = run([READOBJ, "--dynamic-table", path]).stdout.decode(errors="replace")
    m = re.search(r"SONAME\s+Library soname: \[?([^\]\s]+)", out)
    return m.group(1) if m else ""


def arch_key(name):
    m = re.match(r"(?:sm|compute)_(\d+)([a-z]*)$", name)
    return (int(m.group(1)), m.group(2)) if m else (1 << 30, name)


# --- cuobjdump --------------------------------------------------------------
CUOBJ_NAME = re.compile(r"\.(sm_\d+[a-z]*)\.(cubin|ptx)\s*$")
XPTX_RE = re.compile(r"^Extracting PTX file and ptxas options\s+\d+:\s+(\S+\.ptx)(.*)$")


def cuobjdump(path):
    """sass names, ptx [(compute_XX, isa)], error text (None when readable),
    the entry counts, and the ptxas options cuobjdump shows for the PTX."""
    le = run([CUOBJDUMP, "--list-elf", path])
    lp = run([CUOBJDUMP, "--list-ptx", path])
    text = (le.stdout + le.stderr + lp.stdout + lp.stderr).decode(errors="replace")
    if "does not contain device code" in text:
        return [], [], None, 0, 0, []
    if le.returncode != 0 or lp.returncode != 0 or "fatal" in text:
        return None, None, text.strip().splitlines()[0], 0, 0, []
    sass, ptxnames = [], []
    for line in le.stdout.decode().splitlines():
        m = CUOBJ_NAME.search(line)
        if m:
            sass.append(m.group(1))
    for line in lp.stdout.decode().splitlines():
        m = CUOBJ_NAME.search(line)
        if m:
            ptxnames.append(m.group(1))
    ptx, options = [], set()
    if ptxnames:
        # cuobjdump -ptx writes to a pipe one byte per write(2): hours for
        # the larger libraries. -xptx writes each PTX to a file instead;
        # the ISA version is the .version line of each.
        tmp = os.path.join(CACHE, "tmp", "xptx-%d" % threading.get_ident())
        os.makedirs(tmp)
        try:
            out = run([CUOBJDUMP, "-xptx", "all", os.path.abspath(path)], cwd=tmp)
            for line in out.stdout.decode(errors="replace").splitlines():
                m = XPTX_RE.match(line)
                if not m:
                    continue
                fn, opts = m.group(1), m.group(2).strip()
                if opts:
                    options.add(opts)
                with open(os.path.join(tmp, fn), "rb") as f:
                    head = f.read(1 << 16)
                v, tg = VERSION_RE.search(head), TARGET_RE.search(head)
                if not v or not tg:
                    raise SystemExit(f"realbin: {path}: {fn} has no .version/.target line in its first 64 KiB")
                arch = CUOBJ_NAME.search(fn).group(1)
                target = "sm_%d%s" % (int(tg.group(1)), tg.group(2).decode())
                if target != arch:
                    raise SystemExit(f"realbin: {path}: {fn} says .target {target}")
                ptx.append(("compute_" + arch[3:], v.group(1).decode()))
                os.remove(os.path.join(tmp, fn))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if sorted(a for a, _ in ptx) != sorted("compute_" + n[3:] for n in ptxnames):
            raise SystemExit(f"realbin: {path}: cuobjdump -xptx extracted {len(ptx)} PTX, --list-ptx lists {len(ptxnames)}")
    return sass, ptx, None, len(sass), len(ptx), sorted(options)


# --- fatbin payloads (a second opinion; the only one for CUDA 13) -----------
def lz4_block(src, limit):
    """Decode an LZ4 block (no frame) up to limit output bytes."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n and len(out) < limit:
        tok = src[i]
        i += 1
        lit = tok >> 4
        if lit == 15:
            while True:
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        out += src[i:i + lit]
        i += lit
        if i >= n or len(out) >= limit:
            break
        off = src[i] | (src[i + 1] << 8)
        i += 2
        ml = tok & 15
        if ml == 15:
            while True:
                b = src[i]
                i += 1
                ml += b
                if b != 255:
                    break
        ml += 4
        start = len(out) - off
        if off == 0 or start < 0:
            raise ValueError("bad LZ4 match offset")
        if off >= ml:
            out += out[start:start + ml]
        else:
            # An overlapping match repeats the last off bytes.
            out += (bytes(out[start:]) * (ml // off + 1))[:ml]
    return bytes(out[:limit])


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
TARGET_RE = re.compile(rb"^\s*\.target\s+sm_(\d+)([a-z]?)", re.M)
VERSION_RE = re.compile(rb"^\s*\.version\s+(\d+\.\d+)", re.M)
TKARCH_RE = re.compile(rb"-arch[ =]sm_(\d+)([a-z]?)")


def decode_payload(pl, limit):
    """(the start of the decoded payload, compression) of one entry,
    decided by the payload's own first bytes rather than the header flags;
    zstd payloads are decoded whole, the others up to limit bytes."""
    first = bytes(pl[:64])
    if first[:4] == b"\x7fELF":
        return bytes(pl[:limit]), "none"
    if first[:4] == ZSTD_MAGIC:
        if not ZSTD:
            raise SystemExit("realbin: zstd is needed to read CUDA 12.8+ payloads")
        return run([ZSTD, "-dcq"], input=bytes(pl)).stdout, "zstd"
    head = first.lstrip(b"\n\r\t /")
    if head[:1] == b"." or head[:2] == b"//":
        return bytes(pl[:limit]), "none"
    return lz4_block(pl, limit), "lz4"


def cubin_target(b):
    """('sm_120a', source) from a cubin: ptxas's command line in
    .note.nv.tkinfo when it is there, else EF_CUDA_SM in e_flags."""
    m = TKARCH_RE.search(b)
    if m:
        return "sm_%s%s" % (int(m.group(1)), m.group(2).decode()), "tkinfo"
    abiver, (flags,) = b[8], struct.unpack_from("<I", b, 48)
    if abiver >= 8:
        sm, accel = (flags >> 8) & 0xFF, flags & 0x8
    else:
        # 0x800 marks sm_90a in the old ABI, but ptxas 11.8 also sets it
        # on a few sm_50/60/61 cubins (libcublas 11.8: e_flags 0x3c0d32)
        # that cuobjdump lists as plain: it means "a" from sm_90 on only.
        sm, accel = flags & 0xFF, flags & 0x800
    return "sm_%d%s" % (sm, "a" if accel and sm >= 90 else ""), "e_flags"


def fatbin_walk(path, off, size):
    """Walk the .nv_fatbin section: header facts, plus sass/ptx decoded
    from each entry's payload."""
    facts = {"containers": 0, "entries": 0, "header_sizes": set(), "flags": set(),
             "compression": set(), "cubin_target_from": set(), "entry_versions": set()}
    sass, ptx, heads, shapes = [], [], [], set()
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            data = memoryview(mm)[off:off + size]
            p = 0
            while p + 16 <= len(data):
                magic, _, hs, body = struct.unpack_from("<IHHQ", data, p)
                if magic != 0xBA55ED50:
                    p += 8
                    continue
                facts["containers"] += 1
                q, end = p + hs, p + hs + body
                while q + 64 <= end:
                    kind, _, ehs, padded = struct.unpack_from("<HHIQ", data, q)
                    csize, = struct.unpack_from("<I", data, q + 16)
                    minor, major, arch = struct.unpack_from("<HHI", data, q + 24)
                    flags, = struct.unpack_from("<Q", data, q + 40)
                    facts["entries"] += 1
                    facts["header_sizes"].add(ehs)
                    facts["flags"].add(hex(flags))
                    facts["entry_versions"].add(f"{kind}:{major}.{minor}")
                    n = csize if 0 < csize <= padded else padded
                    pl = data[q + ehs:q + ehs + n]
                    body_b, comp = decode_payload(pl, 8 << 10)
                    facts["compression"].add(comp)
                    shape = (kind, ehs, flags, comp)
                    if shape not in shapes:
                        shapes.add(shape)
                        heads.append((kind, ehs, arch, flags, comp, bytes(data[q:q + min(ehs, 112)])))
                    if body_b[:4] == b"\x7fELF":
                        name, src = cubin_target(body_b)
                        if src == "e_flags" and body_b[8] >= 8 and comp != "zstd":
                            # The new cubin ABI: read ptxas's -arch whole.
                            body_b, _ = decode_payload(pl, 1 << 30)
                            name, src = cubin_target(body_b)
                        facts["cubin_target_from"].add(src)
                        sass.append(name)
                    else:
                        t, v = TARGET_RE.search(body_b), VERSION_RE.search(body_b)
                        if (not t or not v) and comp != "zstd":
                            body_b, _ = decode_payload(pl, 1 << 30)
                            t, v = TARGET_RE.search(body_b), VERSION_RE.search(body_b)
                        if not t or not v:
                            raise SystemExit(f"realbin: {path}: PTX entry at {off + q:#x} without .target/.version")
                        ptx.append(("compute_%d%s" % (int(t.group(1)), t.group(2).decode()), v.group(1).decode()))
                    del pl
                    q += ehs + padded
                p = end
        finally:
            del data
            mm.close()
    for k in ("header_sizes", "flags", "compression", "cubin_target_from", "entry_versions"):
        facts[k] = sorted(facts[k])
    facts["sass_entries"], facts["ptx_entries"] = len(sass), len(ptx)
    return sass, ptx, facts, heads


# --- clang-offload-bundler --------------------------------------------------
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"
GFX_RE = re.compile(r"^[^-]+-amdgcn-amd-amdhsa-[^-]*-(.+)$")


def hip_fatbin(path, rel):
    """gfx targets per clang-offload-bundler of each bundle in .hip_fatbin."""
    tmp = os.path.join(CACHE, "tmp", "hip_fatbin")
    r = run([OBJCOPY, "-O", "binary", "--only-section=.hip_fatbin", path, tmp])
    if r.returncode != 0:
        raise SystemExit(f"realbin: llvm-objcopy {rel}: {r.stderr.decode()}")
    gfx, hosts, bundles, ccob = set(), 0, 0, 0
    try:
        with open(tmp, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            starts, i = [], mm.find(BUNDLE_MAGIC)
            while i >= 0:
                starts.append(i)
                i = mm.find(BUNDLE_MAGIC, i + 1)
            i = mm.find(CCOB_MAGIC)
            while i >= 0:
                ccob += i % 8 == 0
                i = mm.find(CCOB_MAGIC, i + 1)
            for k, s in enumerate(starts):
                e = starts[k + 1] if k + 1 < len(starts) else len(mm)
                out = run([BUNDLER, "--list", "--type=o", "--input=-"], input=mm[s:e])
                if out.returncode != 0:
                    raise SystemExit(f"realbin: clang-offload-bundler on bundle {k} of {rel}: "
                                     f"{out.stderr.decode(errors='replace')[:300]}")
                bundles += 1
                for line in out.stdout.decode().split():
                    if line.startswith("host-"):
                        hosts += 1
                        continue
                    m = GFX_RE.match(line)
                    if not m:
                        raise SystemExit(f"realbin: {rel}: unexpected bundle id {line!r}")
                    gfx.add(m.group(1))
            mm.close()
    finally:
        os.remove(tmp)
    return sorted(gfx), bundles, ccob


def embedded_code_objects(path, skip):
    """AMDGPU ELF images lying in the file outside the ranges in skip."""
    found = []
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        i = mm.find(b"\x7fELF\x02\x01\x01", 1)
        while i >= 0:
            if i + 64 <= len(mm) and struct.unpack_from("<H", mm, i + 18)[0] == 224 and \
                    not any(a <= i < a + n for a, n in skip):
                flags, = struct.unpack_from("<I", mm, i + 48)
                shoff, = struct.unpack_from("<Q", mm, i + 0x28)
                es, num = struct.unpack_from("<HH", mm, i + 0x3A)
                found.append({"offset": i, "osabi": mm[i + 7], "abiversion": mm[i + 8],
                              "e_flags": hex(flags), "bytes": shoff + es * num})
            i = mm.find(b"\x7fELF\x02\x01\x01", i + 1)
        mm.close()
    return found


def amdgpu_flags(path, obj):
    """llvm-readobj's reading of an embedded code object's e_flags."""
    tmp = os.path.join(CACHE, "tmp", "code_object")
    with open(path, "rb") as f:
        f.seek(obj["offset"])
        with open(tmp, "wb") as o:
            o.write(f.read(obj["bytes"]))
    out = run([READOBJ, "--file-headers", tmp]).stdout.decode(errors="replace")
    os.remove(tmp)
    return sorted(set(re.findall(r"(EF_AMDGPU_[A-Z0-9_]+)", out)))


# --- one file ---------------------------------------------------------------
def examine(job):
    pkg, ver, path = job
    rel = os.path.relpath(path, CACHE)
    secs = elf_sections(path)
    if secs is None:
        return None
    line = {"file": rel, "package": pkg, "version": ver, "tool": "", "sass": [], "ptx": [], "gfx": [],
            "bytes": os.path.getsize(path)}
    so = soname(path)
    if so:
        line["soname"] = so
    info = {"file": rel}
    tools = []
    nv = secs.get(".nv_fatbin")
    if "__nv_relfatbin" in secs:
        info["relocatable_fatbin"] = True
    sass, ptx, err, n_sass, n_ptx, ptxas = cuobjdump(path)
    if ptxas:
        info["ptxas_options"] = ptxas
    if nv:
        psass, pptx, facts, heads = fatbin_walk(path, *nv)
        info["fatbin"] = facts
        info["heads"] = heads
        if err is None:
            tools.append(T_CUOBJDUMP)
            agree = sorted(set(psass)) == sorted(set(sass)) and sorted(set(pptx)) == sorted(set(ptx))
            info["payload_decode_agrees_with_cuobjdump"] = agree
            if n_sass != len(psass) or n_ptx != len(pptx):
                agree = False
                info["payload_decode_agrees_with_cuobjdump"] = False
                info["entry_counts"] = {"cuobjdump": [n_sass, n_ptx], "payload": [len(psass), len(pptx)]}
        else:
            info["cuobjdump_error"] = err
            tools.append(T_PAYLOAD)
            line["note"] = ("cuobjdump %s cannot read this fatbin (%s); targets and PTX ISA are read from "
                            "each entry's own payload: cubin .note.nv.tkinfo (ptxas -arch) or e_flags, PTX "
                            ".target/.version, zstd %s / LZ4 block decompression" % (CUOBJDUMP_V, err, ZSTD_V))
            sass, ptx = psass, pptx
    elif err is not None:
        raise SystemExit(f"realbin: cuobjdump failed on {rel}, which has no .nv_fatbin: {err}")
    elif sass or ptx:
        tools.append(T_CUOBJDUMP)
        info["note"] = "cuobjdump lists code outside .nv_fatbin"
    hip = secs.get(".hip_fatbin")
    if hip:
        gfx, bundles, ccob = hip_fatbin(path, rel)
        line["gfx"] = gfx
        info["bundles"] = bundles
        info["ccob"] = ccob
        tools.append(T_BUNDLER)
    objs = embedded_code_objects(path, [hip] if hip else [])
    if objs:
        for o in objs:
            o["readobj"] = amdgpu_flags(path, o)
        info["embedded_code_objects"] = objs
    if not tools:
        tools = [T_CUOBJDUMP + ": no device code", "no .hip_fatbin section"]
    line["tool"] = "; ".join(tools)
    line["sass"] = sorted(set(sass), key=arch_key)
    line["ptx"] = [{"arch": a, "isa": v} for a, v in sorted(set(ptx), key=lambda x: (arch_key(x[0]), x[1]))]
    return line, info


if not cached:
    t0 = time.time()
    jobs = []
    for p in packages:
        top = os.path.join(CACHE, p["root"])
        for dp, dns, fns in os.walk(top):
            dns.sort()
            for fn in sorted(fns):
                path = os.path.join(dp, fn)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as f:
                    if f.read(4) != b"\x7fELF":
                        continue
                jobs.append((p["package"], p["version"], path))
    # Largest first, so the two slow cuobjdump -ptx runs overlap the rest.
    jobs.sort(key=lambda j: -os.path.getsize(j[2]))
    with cf.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as ex:
        results = [r for r in ex.map(examine, jobs) if r]
    results.sort(key=lambda r: r[0]["file"])
    lines = [r[0] for r in results]
    infos = [r[1] for r in results]
    heads = []
    for i in infos:
        for h in i.pop("heads", []):
            heads.append({"file": i["file"], "kind": h[0], "header_size": h[1], "arch": h[2],
                          "flags": hex(h[3]), "payload": h[4], "header": h[5].hex()})
    with open(truth_path + ".tmp", "w") as f:
        for ln in lines:
            f.write(json.dumps(ln, sort_keys=False) + "\n")
    os.replace(truth_path + ".tmp", truth_path)
    # ROCm libraries in the archive by unpacked size, for a large-layer benchmark.
    rocm = []
    out = run(["apt-cache", "show", "--no-all-versions"] +
              ["librocsparse0", "librocrand1", "libamdhip64-5", "libamd-comgr2", "libhsa-runtime64-1",
               "librocblas0", "librocfft0", "librocsolver0", "libmiopen1", "librccl1"]).stdout.decode()
    for block in out.split("\n\n"):
        f = dict(re.findall(r"^(Package|Version|Size|Installed-Size): (.*)$", block, re.M))
        if f:
            rocm.append({"package": f["Package"], "version": f["Version"], "deb_bytes": int(f["Size"]),
                         "installed_kib": int(f["Installed-Size"])})
    rocm.sort(key=lambda r: -r["installed_kib"])
    manifest = {
        "generator": GENERATOR,
        "tools": {"cuobjdump": CUOBJDUMP_V, "clang-offload-bundler": BUNDLER_V, "zstd": ZSTD_V,
                  "nvidia-cuda-toolkit": next((d for d in tool_debs if d.startswith("nvidia-cuda-toolkit_")), "")},
        "packages": packages,
        "files": infos,
        "entry_headers": heads,
        "rocm_by_size": rocm,
        "truth_seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(CACHE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(key_path, "w") as f:
        f.write(key)
    lines_n = len(lines)
    print(f"realbin: truth.jsonl: {lines_n} files ({time.time() - t0:.0f} s)")

# --- summary ----------------------------------------------------------------
with open(truth_path) as f:
    lines = [json.loads(l) for l in f]
byp = {}
for ln in lines:
    s = byp.setdefault(ln["package"], [0, 0])
    s[0] += 1
    s[1] += bool(ln["sass"] or ln["ptx"] or ln["gfx"])
print()
print(f"{'package':34} {'version':34} {'download':>9} {'unpacked':>9} {'ELF':>4} {'GPU':>4}")
dl = up = 0
for p in manifest["packages"]:
    s = byp.get(p["package"], [0, 0])
    dl += p["deb_bytes"]
    up += p["unpacked_bytes"]
    print(f"{p['package']:34} {p['version'][:34]:34} {p['deb_bytes'] / 1e6:8.1f}M {p['unpacked_bytes'] / 1e6:8.1f}M "
          f"{s[0]:4} {s[1]:4}")
tools_dl = sum(os.path.getsize(os.path.join(CACHE, "debs", d)) for d in tool_debs)
print(f"{'tools (' + str(len(tool_debs)) + ' packages: cuobjdump, LLVM 15, zstd)':70} {tools_dl / 1e6:8.1f}M")
gpu = sum(1 for ln in lines if ln["sass"] or ln["ptx"] or ln["gfx"])
print(f"{len(manifest['packages'])} packages, {len(lines)} ELF files ({gpu} with GPU code), "
      f"download {(dl + tools_dl) / 1e6:.0f} MB, unpacked {up / 1e6:.0f} MB, "
      f"{time.time() - int(os.environ['REALBIN_START']):.0f} s")
print("largest ROCm libraries in the archive: " + ", ".join(
    f"{r['package']} {r['deb_bytes'] / 1e6:.0f} MB .deb / {r['installed_kib'] / 1e3:.0f} MB installed"
    for r in manifest["rocm_by_size"][:3]))
for i in manifest["files"]:
    if i.get("payload_decode_agrees_with_cuobjdump") is False:
        print(f"realbin: warning: payload decode disagrees with cuobjdump on {i['file']}")
PY
echo "KILN_REALBIN=$CACHE"
