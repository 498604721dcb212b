#!/usr/bin/env bash
# Builds a release of delayd: reproducible, checksummed binaries for linux
# and darwin on amd64 and arm64, and optionally the image.
#
#   deploy/release.sh v0.2.0            # a release: needs a clean tree and
#                                       # a "## 0.2.0" section in CHANGELOG.md
#   deploy/release.sh --snapshot        # a test build of the tree as it is
#
# Options (before the version):
#   --out DIR             where the archives go (default dist/)
#   --platforms "a/b ..." GOOS/GOARCH pairs (default: linux and darwin, amd64
#                         and arm64)
#   --image               also build the image with docker (deploy/Dockerfile)
#
# The same commit gives the same bytes on any machine with the same Go
# version: -trimpath, no build id, no cgo, the commit's own time in the
# archives, and a sorted, owner-less tar with gzip -n. The script tags
# nothing and pushes nothing; it prints the tags to make.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
platforms="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"
image=false
snapshot=false
while (($#)); do
	case $1 in
	--out) out=$2; shift 2 ;;
	--platforms) platforms=$2; shift 2 ;;
	--image) image=true; shift ;;
	--snapshot) snapshot=true; shift ;;
	-h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "release: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done

commit=$(git rev-parse HEAD)
if $snapshot; then
	(($# == 0)) || { echo "release: --snapshot takes no version" >&2; exit 2; }
	version="v0.0.0-snapshot.$(git rev-parse --short=12 HEAD)"
else
	(($# == 1)) || { echo "usage: deploy/release.sh [options] vMAJOR.MINOR.PATCH (or --snapshot); see --help" >&2; exit 2; }
	version=$1
	if ! [[ $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
		echo "release: $version is not a semantic version like v1.2.3" >&2
		exit 2
	fi
	if [[ -n $(git status --porcelain) ]]; then
		echo "release: the working tree has uncommitted changes; commit them or use --snapshot" >&2
		exit 1
	fi
	if ! grep -q "^## ${version#v}\b" CHANGELOG.md; then
		echo "release: CHANGELOG.md has no \"## ${version#v}\" section; write it first (kept by hand)" >&2
		exit 1
	fi
fi

# The commit's time, for reproducible archive timestamps.
epoch=$(git log -1 --format=%ct)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

archives=()
for p in $platforms; do
	goos=${p%/*} goarch=${p#*/}
	name="delayd_${version#v}_${goos}_${goarch}"
	mkdir -p "$work/$name"
	echo "building $name"
	# -buildvcs=true records the commit for `delayd version` (a
	# GOFLAGS=-buildvcs=false in the environment would drop it).
	CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch GOFLAGS= \
		go build -trimpath -buildvcs=true -ldflags "-s -w -buildid= -X main.version=$version" \
		-o "$work/$name/delayd" ./cmd/delayd
	cp README.md CHANGELOG.md "$work/$name/"
	[[ -f LICENSE ]] && cp LICENSE "$work/$name/"
	tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner -C "$work" -cf - "$name" |
		gzip -n -9 >"$out/$name.tar.gz"
	archives+=("$name.tar.gz")
done
(cd "$out" && sha256sum "${archives[@]}" >SHA256SUMS)
echo "wrote $out/SHA256SUMS:"
cat "$out/SHA256SUMS"

if $image; then
	command -v docker >/dev/null || { echo "release: --image needs docker" >&2; exit 1; }
	docker build -f deploy/Dockerfile --build-arg "VERSION=$version" -t "delayd:${version#v}" .
	echo "built image delayd:${version#v}"
fi

if ! $snapshot; then
	cat <<EOF

Release $version of $commit is built. To publish it:
  git tag -a $version -m "delayd $version"
  git push origin $version
then attach $out/*.tar.gz and $out/SHA256SUMS to the release, and push the image.
EOF
	if [[ -f client/go.mod ]]; then
		# The client is a module of its own: its tag carries its path.
		echo "The client module is tagged too: git tag -a client/$version -m \"delayd client $version\" && git push origin client/$version"
	fi
fi
