#!/usr/bin/env bash
# The README's test command: installs what the tests need, runs every test
# with CI=true (so a missing tool fails, never skips) and staticcheck, then
# checks that the run left the checkout as it found it.
#
#   ./test.sh                          everything (.ci/run runs exactly this)
#   ./test.sh -run TestExamples ./cmd/delayd   these go test arguments instead
#
# What it installs, each only when missing:
#   - Debian packages (apt-get, as root or through sudo -n): redis-server,
#     chromium, prometheus (promtool), systemd (systemd-analyze), minisign, nodejs and
#     npm, gcc (for -race);
#   - pinned Go tools, built with go install into the user's cache dir
#     (delayd-tools/<tool>-<version>, where the tests look): helm, natscli
#     (in the background: the tests that use them wait), staticcheck;
#   - examples/node's locked modules (npm ci into examples/node/node_modules,
#     which git ignores).
# What it cannot install stops it, with the exact command to run.
set -euo pipefail
cd "$(dirname "$0")"

fail() {
	echo "test.sh: $*" >&2
	exit 1
}

command -v go >/dev/null 2>&1 || fail "go not found: install Go 1.26.8 or later (https://go.dev/dl/)"
command -v git >/dev/null 2>&1 || fail "git not found: apt-get install -y git"

# The tests find pinned tools in os.UserCacheDir()/delayd-tools.
case "$(uname -s)" in
Darwin) cache="$HOME/Library/Caches" ;;
*) cache="${XDG_CACHE_HOME:-$HOME/.cache}" ;;
esac
tools="$cache/delayd-tools"

# A run must leave the checkout as it found it (go.work.sum complete, tools
# and modules outside it or ignored): snapshot it now, compare at the end.
tree_status() { git status --porcelain=v1 --untracked-files=all; }
tree_sum() { git diff HEAD --binary | cksum; }
before=$(tree_status) before_sum=$(tree_sum)

# Pinned Go tools, built from the module proxy outside the checkout (go
# install pkg@version ignores the workspace; running it from the tools dir
# keeps it away from go.work.sum all the same). First, so that the
# background builds overlap the Debian packages' downloads.
# helm and natscli take minutes to build on a fresh machine (~10 each on two
# cores) and only one test package each needs them: they build in the
# background, holding <dir>.lock (flock), while staticcheck and the other
# tests run; deploy's and cmd/delayd's tests take the same lock, so they
# wait for the build instead of starting their own.
building=()
go_tool_bg() { # dir-name binary package@version minutes [go install flags]
	local dir="$tools/$1"
	[[ -x "$dir/$2" ]] && return
	command -v flock >/dev/null 2>&1 && command -v setsid >/dev/null 2>&1 || { go_tool "$1" "$2" "$3" "${@:5}"; return; }
	echo "test.sh: building $3 in the background (first run only, ~$4 min; the tests that use it wait for it; log: $dir.log)"
	mkdir -p "$tools"
	local t0=$SECONDS
	setsid bash -c 'exec 9>"$1.lock" && flock 9 && { [[ -x "$1/$2" ]] || (cd "$(dirname "$1")" && GOBIN="$1" GOFLAGS= nice go install "${@:5}" "$3"); }' \
		- "$dir" "$2" "$3" "$4" "${@:5}" >"$dir.log" 2>&1 &
	building+=("$!:$1:$t0")
}
# At the end: report each background build; one a targeted run never needed
# is stopped (Go's build cache keeps what it compiled for the next run).
finish_builds() {
	local b pid name t0
	for b in ${building[@]+"${building[@]}"}; do
		IFS=: read -r pid name t0 <<<"$b"
		if kill -0 "$pid" 2>/dev/null; then
			kill -- "-$pid" 2>/dev/null || true
			echo "test.sh: stopped building $name, which this run did not use (the next run goes on from Go's build cache)"
		elif wait "$pid"; then
			echo "test.sh: built $name in $((SECONDS - t0))s"
		else
			echo "test.sh: building $name failed: see $tools/$name.log" >&2
		fi
	done
}
trap finish_builds EXIT

go_tool() { # dir-name binary package@version [go install flags]
	local dir="$tools/$1"
	[[ -x "$dir/$2" ]] && return
	echo "test.sh: installing $3 into $dir"
	mkdir -p "$tools"
	(cd "$tools" && GOBIN="$dir" GOFLAGS= go install "${@:4}" "$3") ||
		fail "could not install $1: run  (cd $tools && GOBIN=$dir GOFLAGS= go install $(printf '%q ' "${@:4}")$3)"
}
# helm as its release is linked (deploy/tools_test.go, helmLDFlags): a plain
# go install assumes Kubernetes 1.20, which the chart's kubeVersion refuses.
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=v3.21.4"
for pkg in chartutil lint/rules; do
	helm_ldflags+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=36"
done
go_tool_bg helm-v3.21.4-k8s1.36 helm helm.sh/helm/v3/cmd/helm@v3.21.4 10 "-ldflags=$helm_ldflags"
go_tool_bg natscli-v0.5.0 nats github.com/nats-io/natscli/nats@v0.5.0 10 # cmd/delayd/examples_test.go
go_tool staticcheck-v0.8.2 staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2

# Debian packages, by the command each one provides.
missing=()
need_pkg() { command -v "$1" >/dev/null 2>&1 || missing+=("${@:2}"); }
need_pkg redis-server redis-server
need_pkg chromium chromium
need_pkg promtool prometheus    # checks and unit-tests the alert rules
need_pkg systemd-analyze systemd # verifies the systemd unit
need_pkg minisign minisign       # signs and verifies the release checksums
need_pkg node nodejs            # runs examples/node
need_pkg npm npm
need_pkg gcc gcc                # cgo, for -race
if ((${#missing[@]})); then
	install="apt-get install -y ${missing[*]}"
	if ! command -v apt-get >/dev/null 2>&1; then
		fail "missing ${missing[*]} (Debian package names): install them with your package manager, e.g. $install"
	fi
	sudo=()
	if [[ $(id -u) != 0 ]]; then
		sudo -n true 2>/dev/null || fail "missing ${missing[*]}: run  sudo apt-get update && sudo $install  (then ./test.sh again)"
		sudo=(sudo -n)
	fi
	echo "test.sh: installing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	"${sudo[@]}" apt-get update -qq || fail "apt-get update failed: run  ${sudo[*]} apt-get update && ${sudo[*]} $install"
	"${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null || fail "apt-get failed: run  ${sudo[*]} $install"
fi

# examples/node's locked dependencies, again when package-lock.json changed.
node_modules=examples/node/node_modules
git check-ignore -q "$node_modules/" || fail "$node_modules is not ignored by git: add node_modules/ to .gitignore"
if [[ ! -f $node_modules/.package-lock.json || examples/node/package-lock.json -nt $node_modules/.package-lock.json ]]; then
	echo "test.sh: installing examples/node's dependencies (npm ci)"
	(cd examples/node && npm ci --no-audit --no-fund) || fail "npm ci failed: run  (cd examples/node && npm ci)"
fi

echo "test.sh: set-up took $((SECONDS))s; running the tests"
export CI=true
if (($#)); then
	go test "$@"
else
	# The tests first, so a fresh machine reaches them early (staticcheck
	# type-checks everything from source first); both always run.
	rc=0
	go test -race -count=1 -timeout 30m ./... || rc=$?
	echo "test.sh: staticcheck"
	"$tools/staticcheck-v0.8.2/staticcheck" ./... || rc=$?
	((rc == 0)) || exit "$rc"
fi

after=$(tree_status)
if [[ "$before" != "$after" || "$before_sum" != "$(tree_sum)" ]]; then
	{
		echo "test.sh: the tests changed the checkout (nothing a test run does may write to it)."
		echo "git status --porcelain before the run:"
		echo "${before:-  (clean)}"
		echo "after:"
		echo "${after:-  (clean)}"
		git diff --stat
	} >&2
	exit 1
fi
echo "test.sh: ok, and the checkout is as the run found it"
