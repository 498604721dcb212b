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
#     (delayd-tools/<tool>-<version>, where the tests look; DELAYD_TOOLS_DIR
#     names another dir, e.g. an empty one to time a first run): helm,
#     natscli and staticcheck, in the background while the tests run (the
#     tests that use helm or natscli wait for them; staticcheck runs last);
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

# The tests find pinned tools in os.UserCacheDir()/delayd-tools, or in
# DELAYD_TOOLS_DIR (toollock.Dir).
case "$(uname -s)" in
Darwin) cache="$HOME/Library/Caches" ;;
*) cache="${XDG_CACHE_HOME:-$HOME/.cache}" ;;
esac
tools="${DELAYD_TOOLS_DIR:-$cache/delayd-tools}"
export DELAYD_TOOLS_DIR="$tools"

# A run must leave the checkout as it found it (go.work.sum complete, tools
# and modules outside it or ignored): snapshot it now, compare at the end.
tree_status() { git status --porcelain=v1 --untracked-files=all; }
tree_sum() { git diff HEAD --binary | cksum; }
before=$(tree_status) before_sum=$(tree_sum)

# Pinned Go tools, built from the module proxy outside the checkout (go
# install pkg@version ignores the workspace; running it from the tools dir
# keeps it away from go.work.sum all the same). First, so that the
# background builds overlap the Debian packages' downloads.
# On a fresh machine they take minutes to build (on two cores helm ~10 min,
# natscli ~10, staticcheck ~4), and nothing before the tests needs them:
# they build in the background, niced, each holding <dir>.lock (flock),
# while the tests run. deploy's and cmd/delayd's tests take the same lock,
# so they wait for helm and natscli instead of starting their own build;
# staticcheck runs after the tests, once its build is done. Each says when
# it starts, who waits for it, and when it is done, how long it took.
building=()
go_tool_bg() { # dir-name binary package@version minutes who-waits [go install flags]
	local dir="$tools/$1"
	[[ -x "$dir/$2" ]] && return
	command -v flock >/dev/null 2>&1 && command -v setsid >/dev/null 2>&1 || { go_tool "$1" "$2" "$3" "${@:6}"; return; }
	local what="${1%%-v[0-9]*} ${3##*@}" # helm v3.21.4
	echo "test.sh: installing $what in the background (first run only: about $4 min on 2 cores; $5; log: $dir.log)"
	mkdir -p "$tools"
	# The build's output goes to its log, the line saying it is done (fd 3)
	# here.
	setsid bash -c 'exec 9>"$1.lock" && flock 9 && { [[ -x "$1/$2" ]] || (cd "$(dirname "$1")" && GOBIN="$1" GOFLAGS= nice go install "${@:5}" "$3"); } &&
		echo "test.sh: $4 installed, ${SECONDS}s after test.sh started it" >&3' \
		- "$dir" "$2" "$3" "$what" "${@:6}" 3>&1 >"$dir.log" 2>&1 &
	building+=("$!:$1")
}
# wait_tool waits for the background build of a tool this run needs now.
wait_tool() { # dir-name binary
	local dir="$tools/$1"
	if [[ ! -x "$dir/$2" ]] && command -v flock >/dev/null 2>&1; then
		echo "test.sh: waiting for $1's build to finish (log: $dir.log)"
		flock "$dir.lock" true
	fi
	[[ -x "$dir/$2" ]] || fail "could not install $1: see $dir.log"
}
# At the end: a build a targeted run never needed is stopped (Go's build
# cache keeps what it compiled for the next run); a failed one is named.
finish_builds() {
	local b pid name
	for b in ${building[@]+"${building[@]}"}; do
		IFS=: read -r pid name <<<"$b"
		if kill -0 "$pid" 2>/dev/null; then
			kill -- "-$pid" 2>/dev/null || true
			echo "test.sh: stopped installing $name, which this run did not use (the next run goes on from Go's build cache)"
		elif ! wait "$pid"; then
			echo "test.sh: installing $name failed: see $tools/$name.log" >&2
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
go_tool_bg helm-v3.21.4-k8s1.36 helm helm.sh/helm/v3/cmd/helm@v3.21.4 10 "the deploy tests wait for it" "-ldflags=$helm_ldflags"
go_tool_bg natscli-v0.5.0 nats github.com/nats-io/natscli/nats@v0.5.0 10 "cmd/delayd's TestExamples waits for it"
go_tool_bg staticcheck-v0.8.2 staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2 4 "it runs after the tests"

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

echo "test.sh: set-up took $((SECONDS))s; running the tests${building[*]:+ (what installs in the background says when it is done)}"
export CI=true
if (($#)); then
	go test "$@"
else
	# The tests first, so a fresh machine reaches them early (staticcheck
	# type-checks everything from source first); both always run.
	rc=0
	go test -race -count=1 -timeout 30m ./... || rc=$?
	wait_tool staticcheck-v0.8.2 staticcheck
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
