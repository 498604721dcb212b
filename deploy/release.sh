#!/usr/bin/env bash
# Builds a release of delayd: reproducible, checksummed binaries for linux
# and darwin on amd64 and arm64, and optionally the image.
#
#   deploy/release.sh v0.2.0            # a release: needs a clean tree, one
#                                       # version everywhere (CHANGELOG.md's
#                                       # "## 0.2.0", the chart's version and
#                                       # appVersion, the manifests' image)
#                                       # and the client released first
#   deploy/release.sh --snapshot        # a test build of the tree as it is
#   deploy/release.sh --sign DIR        # sign DIR/SHA256SUMS (built elsewhere)
#
# Each archive holds the binary, LICENSE, README.md, CHANGELOG.md, the
# reference config (configs/delayd.yaml) and the systemd unit
# (systemd/delayd.service). With RELEASE_SIGNING_KEY set to a minisign
# secret key file, SHA256SUMS is signed (SHA256SUMS.minisig) and, with
# RELEASE_SIGNING_PUBKEY (or deploy/minisign.pub), checked against the
# public key; without it the script says the release is unsigned.
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
#
# The client is a module of its own (client/go.mod), tagged client/vX.Y.Z.
# The main module requires it at the version being released, and `go install
# .../cmd/delayd@vX.Y.Z` builds with that published client, not with this
# checkout. So the client tag comes first, at a commit whose client/ is this
# one; then go.sum gets its checksums; then vX.Y.Z is tagged. A release is
# built as `go install` builds it (GOWORK=off: go.mod, go.sum and the
# published client); a snapshot with the workspace (go.work), as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
platforms="linux/amd64 linux/arm64 darwin/amd64 darwin/arm64"
image=false
snapshot=false
sign_only=
while (($#)); do
	case $1 in
	--out) out=$2; shift 2 ;;
	--platforms) platforms=$2; shift 2 ;;
	--image) image=true; shift ;;
	--snapshot) snapshot=true; shift ;;
	--sign) sign_only=$2; shift 2 ;;
	-h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
	-*) echo "release: unknown option $1 (see --help)" >&2; exit 2 ;;
	*) break ;;
	esac
done

# check_versions refuses a release that is not one version everywhere:
# the CHANGELOG's first section, the chart's version and appVersion, the
# image tag the chart defaults to and the plain manifests' image. It lists
# every disagreement.
check_versions() {
	local v=${1#v} chart=deploy/helm/delayd/Chart.yaml values=deploy/helm/delayd/values.yaml bad=0 got f key
	if ! grep -q "^## $v\s*$" CHANGELOG.md; then
		echo "release: CHANGELOG.md has no \"## $v\" section; write it first (kept by hand: \"Unreleased ($v)\" becomes \"$v\")" >&2
		bad=1
	else
		got=$(sed -n -E 's/^## (Unreleased \()?([0-9]+\.[0-9]+\.[0-9]+[-0-9A-Za-z.]*)\)?\s*$/\2/p' CHANGELOG.md | head -1)
		if [[ $got != "$v" ]]; then
			echo "release: CHANGELOG.md is about $got (its first section), not $v" >&2
			bad=1
		fi
	fi
	for key in version appVersion; do
		got=$(awk -v k="$key:" '$1 == k { gsub(/["\047]/, "", $2); print $2; exit }' "$chart")
		if [[ $got != "$v" ]]; then
			echo "release: $chart has $key ${got:-(none)}, not $v" >&2
			bad=1
		fi
	done
	# image.tag empty means the appVersion.
	got=$(awk '$1 == "tag:" { gsub(/["\047]/, "", $2); print ($2 ~ /^#/ ? "" : $2); exit }' "$values")
	if [[ -n $got && $got != "$v" ]]; then
		echo "release: $values has image.tag $got, not $v (leave it empty: the appVersion)" >&2
		bad=1
	fi
	for f in deploy/kubernetes/*.yaml; do
		for got in $(grep -o "ghcr\.io/delayd/delayd:[^[:space:]\"']*" "$f"); do
			if [[ ${got##*:} != "$v" ]]; then
				echo "release: $f deploys $got, not $v" >&2
				bad=1
			fi
		done
	done
	if ((bad)); then
		echo "  a release is one version everywhere: set each to $v and commit (CONTRIBUTING.md, Releasing)" >&2
		exit 1
	fi
}

# check_client refuses a release whose client module is not released
# first, and says what to do.
check_client() {
	local v=$1 mod=github.com/delayd/delayd/client required out
	required=$(awk -v m="$mod" '$1 == m { print $2 } $1 == "require" && $2 == m { print $3 }' go.mod)
	if [[ $required != "$v" ]]; then
		echo "release: go.mod requires $mod ${required:-at no version}, not $v:" >&2
		echo "  go mod edit -require=$mod@$v, and the same version in go.work's replace" >&2
		exit 1
	fi
	if ! grep -q "^replace $mod $v => ./client\$" go.work; then
		echo "release: go.work does not replace $mod $v (the version go.mod requires) with ./client" >&2
		exit 1
	fi
	if ! git rev-parse -q --verify "refs/tags/client/$v" >/dev/null; then
		echo "release: the client module is released first, as client/$v:" >&2
		echo "  git tag -a client/$v -m \"delayd client $v\" && git push origin client/$v" >&2
		echo "  GOWORK=off go mod tidy   # its checksums into go.sum; commit go.sum" >&2
		echo "then run deploy/release.sh $v again (CONTRIBUTING.md, Releasing)." >&2
		exit 1
	fi
	if ! git diff --quiet "client/$v" HEAD -- client; then
		echo "release: client/ changed since the tag client/$v, and the release builds with the tagged client:" >&2
		git diff --stat "client/$v" HEAD -- client >&2
		exit 1
	fi
	if ! grep -q "^$mod $v h1:" go.sum || ! grep -q "^$mod $v/go.mod h1:" go.sum; then
		echo "release: go.sum has no checksums for $mod $v: GOWORK=off go mod tidy, and commit go.sum" >&2
		exit 1
	fi
	# What `go install` will do: fetch the published client/$v and check it against go.sum.
	if ! out=$(GOWORK=off GOFLAGS= go list -deps ./cmd/delayd 2>&1 >/dev/null); then
		echo "release: ./cmd/delayd does not build with the published client/$v (was it pushed?):" >&2
		echo "$out" >&2
		exit 1
	fi
}

# sign signs $1/SHA256SUMS with minisign when RELEASE_SIGNING_KEY names a
# secret key, after checking the archives against it. Without a key it
# says so and returns 1: the release is then unsigned, and users rely on
# the checksums and a rebuild (docs/security.md, Release provenance).
sign() {
	local dir=$1 version pub
	if [[ -z ${RELEASE_SIGNING_KEY:-} ]]; then
		echo "release: SHA256SUMS is NOT signed: set RELEASE_SIGNING_KEY to the minisign secret key file to sign it" >&2
		echo "  (docs/security.md, Release provenance; then: deploy/release.sh --sign $dir)" >&2
		return 1
	fi
	command -v minisign >/dev/null || { echo "release: signing needs minisign (apt-get install minisign, brew install minisign)" >&2; exit 1; }
	if ! (cd "$dir" && sha256sum --quiet -c SHA256SUMS >&2); then
		echo "release: the archives in $dir do not match its SHA256SUMS; not signing" >&2
		exit 1
	fi
	version=$(awk 'NR == 1 { split($2, p, "_"); print p[2] }' "$dir/SHA256SUMS")
	minisign -S -s "$RELEASE_SIGNING_KEY" -m "$dir/SHA256SUMS" -x "$dir/SHA256SUMS.minisig" \
		-t "delayd $version SHA256SUMS" -c "signature of delayd $version's SHA256SUMS" >&2
	pub=${RELEASE_SIGNING_PUBKEY:-deploy/minisign.pub}
	if [[ -f $pub ]]; then
		minisign -V -q -p "$pub" -m "$dir/SHA256SUMS" -x "$dir/SHA256SUMS.minisig" >&2 ||
			{ echo "release: the signature does not verify with $pub: the wrong key?" >&2; exit 1; }
	fi
	echo "signed $dir/SHA256SUMS: $dir/SHA256SUMS.minisig"
}

if [[ -n $sign_only ]]; then
	[[ -f $sign_only/SHA256SUMS ]] || { echo "release: no $sign_only/SHA256SUMS to sign" >&2; exit 2; }
	sign "$(cd "$sign_only" && pwd)" || exit 1
	exit 0
fi

commit=$(git rev-parse HEAD)
gowork=
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
	check_versions "$version"
	check_client "$version"
	gowork=off
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
	CGO_ENABLED=0 GOOS=$goos GOARCH=$goarch GOFLAGS= GOWORK=$gowork \
		go build -trimpath -buildvcs=true -ldflags "-s -w -buildid= -X main.version=$version" \
		-o "$work/$name/delayd" ./cmd/delayd
	mkdir -p "$work/$name/configs" "$work/$name/systemd"
	cp LICENSE README.md CHANGELOG.md "$work/$name/"
	cp configs/delayd.yaml "$work/$name/configs/"
	cp deploy/systemd/delayd.service "$work/$name/systemd/"
	# Modes fixed too: a checkout's depend on the umask.
	tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode='u+rw,go+r,go-w' \
		-C "$work" -cf - "$name" | gzip -n -9 >"$out/$name.tar.gz"
	archives+=("$name.tar.gz")
done
(cd "$out" && sha256sum "${archives[@]}" >SHA256SUMS)
echo "wrote $out/SHA256SUMS:"
cat "$out/SHA256SUMS"
rm -f "$out/SHA256SUMS.minisig" # a stale signature of an earlier build
signed=true
sign "$out" || signed=false

if $image; then
	command -v docker >/dev/null || { echo "release: --image needs docker" >&2; exit 1; }
	docker build -f deploy/Dockerfile --build-arg "VERSION=$version" -t "delayd:${version#v}" .
	echo "built image delayd:${version#v}"
fi

if ! $snapshot; then
	cat <<EOF

Release $version of $commit is built, with the client module client/$version. To publish it:
  git tag -a $version -m "delayd $version"
  git push origin $version
then attach $out/*.tar.gz, $out/SHA256SUMS and $out/SHA256SUMS.minisig to the
release, push the image and publish the chart (CONTRIBUTING.md, Releasing).
EOF
	$signed || echo "NOT SIGNED: sign before publishing (RELEASE_SIGNING_KEY=... deploy/release.sh --sign $out)." >&2
fi
