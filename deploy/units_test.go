package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("systemd/delayd.service")
	if err != nil {
		t.Fatal(err)
	}
	unit := string(b)
	for _, want := range []string{"SystemCallErrorNumber=EPERM", "MemoryMax=", "Environment=GOMEMLIMIT=", "DynamicUser=yes"} {
		if !strings.Contains(unit, "\n"+want) {
			t.Errorf("unit lacks %s", want)
		}
	}
	// Credentials are documented, and none is required by default: a
	// listed file that is missing stops the unit from starting.
	if !strings.Contains(unit, "#   LoadCredential=nats.creds:") {
		t.Error("the unit does not show how to hand it the NATS creds file")
	}
	if strings.Contains(unit, "\nLoadCredential=") {
		t.Error("the unit requires a credential file by default")
	}
	analyze := tool(t, "systemd-analyze", "apt-get install systemd")
	// verify checks that ExecStart exists: point it at a fresh build.
	dir := t.TempDir()
	bin := filepath.Join(dir, "delayd")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/delayd").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	path := filepath.Join(dir, "delayd.service")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(unit, "/usr/local/bin/delayd", bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := tryRun(analyze, "verify", path)
	if err != nil || strings.Contains(out, "delayd.service") {
		t.Errorf("systemd-analyze verify: %v %s", err, out)
	}
}

var exactTag = regexp.MustCompile(`^[a-z0-9./-]+:[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9]+)?(@sha256:[a-f0-9]{64})?$`)

func TestComposeAndImage(t *testing.T) {
	t.Parallel()
	c := docs(t, "docker-compose.yaml")[0]
	services, _ := c["services"].(map[string]any)
	for name, s := range services {
		if dig(s, "healthcheck", "test") == nil {
			t.Errorf("service %s has no healthcheck", name)
		}
		if img, ok := dig(s, "image").(string); ok && !exactTag.MatchString(img) {
			t.Errorf("service %s: image %s is not an exact version", name, img)
		}
		ports, _ := dig(s, "ports").([]any)
		for _, p := range ports {
			if !strings.HasPrefix(p.(string), "127.0.0.1:") {
				t.Errorf("service %s publishes %s beyond loopback", name, p)
			}
		}
	}
	deps, _ := dig(services["delayd"], "depends_on").(map[string]any)
	for _, d := range []string{"redis", "nats"} {
		if dig(deps[d], "condition") != "service_healthy" {
			t.Errorf("delayd does not wait for %s to be healthy", d)
		}
	}
	b, _ := os.ReadFile("Dockerfile")
	if !strings.Contains(string(b), `HEALTHCHECK`) || !strings.Contains(string(b), `"healthcheck"]`) {
		t.Error("Dockerfile has no HEALTHCHECK running delayd healthcheck")
	}
	if _, err := os.Stat("../.dockerignore"); err != nil {
		t.Error("no .dockerignore")
	}
}

// The files the Dockerfile copies before `go mod download` make a whole
// workspace: the main module and the client module it requires at a version
// go.work replaces with ./client (published or not). Checked by copying them
// alone and listing the modules, as the image's download step does.
func TestDockerfileCopiesTheModules(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var copied []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "RUN" {
			break // the first RUN is the download
		}
		if len(f) < 3 || f[0] != "COPY" || strings.HasPrefix(f[1], "--") {
			continue
		}
		dest := f[len(f)-1]
		for _, src := range f[1 : len(f)-1] {
			data, err := os.ReadFile(filepath.Join("..", src))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(dir, dest, filepath.Base(src)), data)
			copied = append(copied, src)
		}
	}
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=", "GOFLAGS=-mod=readonly")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "github.com/delayd/delayd/client\n") {
		t.Fatalf("go list -m all with the files copied before the download (%v): %v\n%s", copied, err, out)
	}
}
