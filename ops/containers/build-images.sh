#!/usr/bin/env bash
# Build agentrl's container images locally (no registry needed):
#
#   agentrl/base        debootstrap --variant=minbase bookworm + the packages in
#                       environments/containers/base/packages.txt, imported as an image
#   agentrl/<stem>      every environments/containers/<stem>.Dockerfile (FROM agentrl/base)
#
# Each image carries a label agentrl.hash: a digest of what it is built from (its recipe,
# its build context, its parent image's id). An image whose label matches is not rebuilt,
# so a second run takes seconds. The env-worker context is the project's wheel, built
# here from the working tree and hashed by its contents (file names and bytes), so the
# image follows every code change.
#
# Engine: podman (default when installed) or docker: AGENTRL_ENGINE=docker.
# Cache: $AGENTRL_CI_CACHE/containers (default ~/.cache/agentrl-ci/containers).
# Mirror: $AGENTRL_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SPECS=environments/containers
ENGINE="${AGENTRL_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}"
MIRROR="${AGENTRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
WORK="${AGENTRL_CI_CACHE:-$HOME/.cache/agentrl-ci}/containers"
PYTHON="${PYTHON:-python3}"  # makes the build venv
mkdir -p "$WORK"
exec 9>"$WORK/.lock" && flock 9  # one build at a time (CI and a developer may overlap)

say() { echo "build-images: $*" >&2; }
sha() { sha256sum | cut -c1-16; }
label_of() { "$ENGINE" image inspect --format '{{index .Config.Labels "agentrl.hash"}}' "$1" 2>/dev/null || true; }
image_id() { "$ENGINE" image inspect --format '{{.Id}}' "$1"; }
# Digest of a directory's files: relative names and contents, in a stable order.
tree_hash() { (cd "$1" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0r sha256sum) | sha; }

# --- agentrl/base ------------------------------------------------------------------------
build_base() {
    local packages want
    packages=$(grep -v '^#' "$SPECS/base/packages.txt" | xargs | tr ' ' ,)
    want=$( (echo "bookworm minbase v1 $packages"; tree_hash "$SPECS/base") | sha)
    if [ "$(label_of agentrl/base)" = "$want" ]; then
        say "agentrl/base is up to date ($want)"
        return
    fi
    curl -fsS --max-time 20 -o /dev/null "$MIRROR/dists/bookworm/Release" \
        || { say "the Debian mirror $MIRROR does not answer"; exit 1; }
    local rootfs="$WORK/base-rootfs"
    rm -rf "$rootfs"
    say "debootstrap bookworm ($packages) from $MIRROR"
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$MIRROR" \
        >"$WORK/debootstrap.log" 2>&1 || { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
    say "importing agentrl/base"
    tar -C "$rootfs" --numeric-owner -c . | "$ENGINE" import \
        --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        --change "LABEL agentrl.hash=$want" - agentrl/base >"$WORK/import.log" 2>&1 \
        || { cat "$WORK/import.log" >&2; exit 1; }
    rm -rf "$rootfs"
}

# --- agentrl/<stem> ----------------------------------------------------------------------
# The build context of <stem>: environments/containers/<stem>/ when that folder exists,
# else environments/containers/ itself; env-worker's is made here (requirements + wheel).
# Every context also gets build-ca.crt: the CA bundle this host trusts
# ($AGENTRL_BUILD_CA, default /etc/ssl/certs/ca-certificates.crt; empty when neither
# exists), for a build that fetches over TLS through an intercepting proxy.
stage_context() {
    local stem=$1 ctx="$WORK/ctx-$1"
    rm -rf "$ctx" && mkdir -p "$ctx"
    if [ "$stem" = env-worker ]; then
        cp "$SPECS/env-worker.requirements.txt" "$ctx/"
        # A build venv of our own: a wheel without build isolation takes 1 s, not 15.
        if [ ! -x "$WORK/build-venv/bin/python" ]; then
            "$PYTHON" -m venv "$WORK/build-venv"
            "$WORK/build-venv/bin/pip" install -q "setuptools>=70.1" >&2
        fi
        # From a clean copy of the sources: an in-tree build/ keeps deleted modules.
        local src="$WORK/src" dirs
        dirs=$(sed -n 's/^ *agentrl\.[a-z_.]* = \([A-Za-z_/]\+\)$/\1/p' setup.cfg | sort -u)
        rm -rf "$src" && mkdir -p "$src"
        # shellcheck disable=SC2086
        tar -C "$ROOT" --exclude=__pycache__ -c setup.cfg pyproject.toml README.md $dirs \
            | tar -C "$src" -x
        "$WORK/build-venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$ctx" "$src" >&2
    elif [ -d "$SPECS/$stem" ]; then
        cp -a "$SPECS/$stem/." "$ctx/"
    else
        cp -a "$SPECS/." "$ctx/"
    fi
    local ca="${AGENTRL_BUILD_CA:-/etc/ssl/certs/ca-certificates.crt}"
    if [ -f "$ca" ]; then cp "$ca" "$ctx/build-ca.crt"; else : >"$ctx/build-ca.crt"; fi
    echo "$ctx"
}

# A wheel's bytes change with file times; its contents do not.
context_hash() {
    "$WORK/build-venv/bin/python" - "$1" <<'PY'
import hashlib, pathlib, sys, zipfile
digest = hashlib.sha256()
for path in sorted(p for p in pathlib.Path(sys.argv[1]).rglob("*") if p.is_file()):
    digest.update(str(path.relative_to(sys.argv[1])).encode() + b"\0")
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as whl:
            for name in sorted(whl.namelist()):
                digest.update(name.encode() + b"\0" + whl.read(name))
    else:
        digest.update(path.read_bytes())
print(digest.hexdigest()[:16])
PY
}

build_image() {
    local dockerfile=$1 stem ctx want
    stem=$(basename "$dockerfile" .Dockerfile)
    ctx=$(stage_context "$stem")
    want=$( (cat "$dockerfile"; context_hash "$ctx"; image_id agentrl/base) | sha)
    if [ "$(label_of "agentrl/$stem")" = "$want" ]; then
        say "agentrl/$stem is up to date ($want)"
        return
    fi
    say "building agentrl/$stem"
    local started=$SECONDS
    "$ENGINE" build --network host --label "agentrl.hash=$want" -t "agentrl/$stem" \
        -f "$ROOT/$dockerfile" "$ctx" >"$WORK/build-$stem.log" 2>&1 \
        || { tail -40 "$WORK/build-$stem.log" >&2; say "agentrl/$stem failed"; exit 1; }
    say "agentrl/$stem built in $((SECONDS - started)) s"
}

build_base
for dockerfile in "$SPECS"/*.Dockerfile; do
    [ -e "$dockerfile" ] && build_image "$dockerfile"
done
# Our images replaced by a rebuild are untagged and unused now (other images are left alone).
"$ENGINE" image prune -f --filter label=agentrl.hash >/dev/null
