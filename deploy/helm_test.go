package deploy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/delayd/delayd/internal/config"
)

const chartDir = "helm/delayd"

// template renders a chart with helm template, as a user does: with no
// --kube-version (TestHelmRendersWithoutKubeVersion).
func template(t *testing.T, chart string, args ...string) string {
	t.Helper()
	return run(t, helm(t), append([]string{"template", "rel", chart}, args...)...)
}

// TestHelmRendersWithoutKubeVersion: with no cluster, helm template and
// helm lint check the chart's kubeVersion (>= 1.29) against the Kubernetes
// version built into helm. A release binary carries its client libraries'
// (1.36 for v3.21.4); a plain go install carries 1.20 and refuses the
// chart. The pinned helm is built as the release is, so the commands the
// docs give work as written.
func TestHelmRendersWithoutKubeVersion(t *testing.T) {
	t.Parallel()
	h := helm(t)
	if _, err := tryRun(h, "template", "rel", chartDir); err != nil {
		t.Errorf("helm template without --kube-version: %v", err)
	}
	if _, err := tryRun(h, "lint", "--strict", chartDir); err != nil {
		t.Errorf("helm lint without --kube-version: %v", err)
	}
}

// parentChart lays out testdata/parent with this chart as its dependency,
// as `helm dependency build` would.
func parentChart(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "parent")
	copyDir(t, "testdata/parent", dir)
	copyDir(t, chartDir, filepath.Join(dir, "charts", "delayd"))
	return dir
}

func TestHelmLint(t *testing.T) {
	t.Parallel()
	h := helm(t)
	run(t, h, "lint", "--strict", chartDir)
	run(t, h, "lint", "--strict", chartDir, "--set", "mode=sidecar")
	run(t, h, "lint", "--strict", parentChart(t))
}

// everything turns on every optional object of fleet mode.
var everything = []string{
	"--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true",
	"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.restrictEgress=true",
	"--set", "secrets.natsToken=s3cret-nats", "--set", "secrets.redisPassword=s3cret-redis",
	"--set", "secrets.uiBearerToken=s3cret-ui", "--set", "secrets.uiBasicAuthPassword=s3cret-basic",
	"--set", "secrets.natsPassword=s3cret-natspw",
}

func TestHelmFleet(t *testing.T) {
	t.Parallel()
	objs := decodeStrict(t, template(t, chartDir, everything...))
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
	}
	for _, k := range []string{"Deployment", "Service", "ConfigMap", "Secret", "ServiceAccount", "PodDisruptionBudget",
		"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Pod"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s, want 1 (rendered: %v)", kinds[k], k, kinds)
		}
	}

	// Several fleets in one Prometheus: the alerts group by (namespace,
	// fleet), and the ServiceMonitor sets fleet.
	if out := template(t, chartDir, everything...); !strings.Contains(out, "targetLabel: fleet") {
		t.Error("the ServiceMonitor sets no fleet label")
	}

	d := find[*appsv1.Deployment](objs)[0]
	ps := d.Spec.Template.Spec
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Error("the service account token is automounted")
	}
	if sa := find[*corev1.ServiceAccount](objs)[0]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("ServiceAccount automounts its token")
	}
	if len(ps.TopologySpreadConstraints) == 0 {
		t.Error("no topology spread by default")
	}
	c := ps.Containers[0]
	checkHardened(t, "fleet", c)
	if probePath(c.ReadinessProbe) != "/readyz" || probePath(c.LivenessProbe) != "/livez" {
		t.Errorf("fleet probes: readiness %s, liveness %s", probePath(c.ReadinessProbe), probePath(c.LivenessProbe))
	}
	// Start-up waits on /livez: a pod started during a Redis or NATS
	// outage must not be killed and backed off for minutes.
	if probePath(c.StartupProbe) != "/livez" {
		t.Errorf("fleet startup probe asks %s, want /livez", probePath(c.StartupProbe))
	}
	if c.Ports[0].ContainerPort != 9479 {
		t.Errorf("admin port %d", c.Ports[0].ContainerPort)
	}

	// Secrets: in the Secret, never in the ConfigMap; each reaches the
	// container as the DELAYD_* variable of its config key.
	cm := find[*corev1.ConfigMap](objs)[0]
	for _, s := range []string{"s3cret", "token", "password"} {
		if strings.Contains(cm.Data["delayd.yaml"], s) {
			t.Errorf("ConfigMap holds %q:\n%s", s, cm.Data["delayd.yaml"])
		}
	}
	sec := find[*corev1.Secret](objs)[0]
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			env[e.Name] = e.ValueFrom.SecretKeyRef.Key
			if e.ValueFrom.SecretKeyRef.Name != sec.Name {
				t.Errorf("%s from secret %s, want %s", e.Name, e.ValueFrom.SecretKeyRef.Name, sec.Name)
			}
		}
	}
	for v, key := range map[string]string{"DELAYD_NATS_TOKEN": "nats-token", "DELAYD_NATS_PASSWORD": "nats-password",
		"DELAYD_REDIS_PASSWORD": "redis-password", "DELAYD_UI_BEARER_TOKEN": "ui-bearer-token",
		"DELAYD_UI_BASIC_AUTH_PASSWORD": "ui-basic-auth-password"} {
		if env[v] != key {
			t.Errorf("env %s from key %q, want %q", v, env[v], key)
		}
		if !strings.HasPrefix(sec.StringData[key], "s3cret") {
			t.Errorf("Secret key %s = %q", key, sec.StringData[key])
		}
	}

	pdb := find[*policyv1.PodDisruptionBudget](objs)[0]
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PDB maxUnavailable %v", pdb.Spec.MaxUnavailable)
	}
	np := find[*networkingv1.NetworkPolicy](objs)[0]
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.String() != "admin" {
		t.Errorf("NetworkPolicy ingress must allow the admin port only: %+v", np.Spec.Ingress)
	}
	svc := find[*corev1.Service](objs)[0]
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "admin" {
		t.Errorf("Service exposes %+v, want the admin port only", svc.Spec.Ports)
	}

	// The helm test pod schedules and receives one message with the
	// same config and secrets.
	pod := find[*corev1.Pod](objs)[0]
	if pod.Annotations["helm.sh/hook"] != "test" {
		t.Error("test pod is not a helm test hook")
	}
	checkHardened(t, "helm test", pod.Spec.Containers[0])
	if args := strings.Join(pod.Spec.Containers[0].Args, " "); !strings.HasPrefix(args, "bench ") || !strings.Contains(args, "--count 1") {
		t.Errorf("helm test args: %s", args)
	}

	// The PrometheusRule carries the rules file of deploy/monitoring.
	rule := find[*prometheusRule](objs)[0]
	if len(rule.Spec.Groups) == 0 || len(rule.Spec.Groups[0].Rules) < 8 {
		t.Errorf("PrometheusRule has %d groups", len(rule.Spec.Groups))
	}
}

// TestHelmPortsFollowValues: moving http.addr moves the container port,
// the probes (by name), the Service and nothing stays on 9479.
func TestHelmPortsFollowValues(t *testing.T) {
	t.Parallel()
	out := template(t, chartDir, append(everything, "--set", "config.http.addr=0.0.0.0:9601")...)
	if strings.Contains(out, "9479") {
		t.Error("9479 is still rendered with http.addr :9601")
	}
	objs := decodeStrict(t, out)
	c := find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0]
	if c.Ports[0].ContainerPort != 9601 || c.ReadinessProbe.HTTPGet.Port.String() != "admin" {
		t.Errorf("port %d, probe port %s", c.Ports[0].ContainerPort, c.ReadinessProbe.HTTPGet.Port.String())
	}
	if p := find[*corev1.Service](objs)[0].Spec.Ports[0].Port; p != 9601 {
		t.Errorf("Service port %d", p)
	}
}

// TestHelmUpdateStrategy: the fleet's strategy is Kubernetes' default
// unless updateStrategy sets one (Recreate for a stored-format upgrade).
func TestHelmUpdateStrategy(t *testing.T) {
	t.Parallel()
	if s := find[*appsv1.Deployment](decodeStrict(t, template(t, chartDir)))[0].Spec.Strategy; s.Type != "" {
		t.Errorf("default strategy %q, want none rendered", s.Type)
	}
	objs := decodeStrict(t, template(t, chartDir, "--set", "updateStrategy.type=Recreate"))
	if s := find[*appsv1.Deployment](objs)[0].Spec.Strategy; s.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("strategy %q, want Recreate", s.Type)
	}
}

func TestHelmExistingSecret(t *testing.T) {
	t.Parallel()
	objs := decodeStrict(t, template(t, chartDir, "--set", "existingSecret=mine", "--set", "secrets.redisPassword=ignored"))
	if n := len(find[*corev1.Secret](objs)); n != 0 {
		t.Errorf("%d Secrets rendered with existingSecret", n)
	}
	for _, e := range find[*appsv1.Deployment](objs)[0].Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name != "mine" {
			t.Errorf("%s from %s, want existingSecret mine", e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
}

// TestHelmSidecarChecksum: the parent's pod template carries a digest of
// delayd's config, so a helm upgrade with a new delayd config rolls the
// application pods.
func TestHelmSidecarChecksum(t *testing.T) {
	t.Parallel()
	sum := func(args ...string) string {
		for _, d := range find[*appsv1.Deployment](decodeStrict(t, template(t, parentChart(t), args...))) {
			if d.Name == "orders" {
				return d.Spec.Template.Annotations["checksum/delayd"]
			}
		}
		t.Fatal("parent Deployment not rendered")
		return ""
	}
	a, b := sum(), sum("--set", "delayd.config.shards=32")
	if a == "" || a == b {
		t.Fatalf("checksum %q before and %q after a config change: want two different digests", a, b)
	}
	if c := sum("--set", "delayd.secrets.redisPassword=new"); c == a {
		t.Fatal("a new secret did not change the checksum")
	}
}

// TestHelmSidecarParent renders a parent chart that includes the sidecar
// template, as users do, and checks the native sidecar.
func TestHelmSidecarParent(t *testing.T) {
	t.Parallel()
	objs := decodeStrict(t, template(t, parentChart(t)))
	var orders *appsv1.Deployment
	for _, d := range find[*appsv1.Deployment](objs) {
		if d.Name == "orders" {
			orders = d
		} else {
			t.Errorf("sidecar mode rendered Deployment %s", d.Name)
		}
	}
	if orders == nil {
		t.Fatal("parent Deployment not rendered")
	}
	ps := orders.Spec.Template.Spec
	if len(ps.InitContainers) != 1 {
		t.Fatalf("%d init containers", len(ps.InitContainers))
	}
	c := ps.InitContainers[0]
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Error("the sidecar lacks restartPolicy: Always: the pod would never start")
	}
	checkHardened(t, "sidecar", c)
	// Probe coupling: a native sidecar's readiness (and startup) is part
	// of the pod's Ready condition and gates the app's start. They must
	// not ask /readyz, or a Redis or NATS outage would pull every
	// application pod out of its Service.
	for name, p := range map[string]string{"startup": probePath(c.StartupProbe), "readiness": probePath(c.ReadinessProbe),
		"liveness": probePath(c.LivenessProbe)} {
		if p != "/livez" {
			t.Errorf("sidecar %s probe asks %q, want /livez", name, p)
		}
	}
	if c.Ports[0].ContainerPort != 9555 {
		t.Errorf("admin port %d, want 9555 from the parent's values", c.Ports[0].ContainerPort)
	}
	if app := docs(t, chartDir+"/Chart.yaml")[0]["appVersion"]; !strings.HasSuffix(c.Image, fmt.Sprintf(":%v", app)) {
		t.Errorf("image %s: the tag must default to delayd's appVersion, not the parent's", c.Image)
	}
	vols := map[string]bool{}
	for _, v := range ps.Volumes {
		vols[v.Name] = true
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = true
		if !vols[m.Name] {
			t.Errorf("mount %s has no volume", m.Name)
		}
	}
	if !mounts["nats-creds"] || !mounts["delayd-config"] {
		t.Errorf("mounts %v", mounts)
	}
	var extra bool
	for _, e := range c.Env {
		extra = extra || e.Name == "DELAYD_LOG_LEVEL"
	}
	if !extra {
		t.Error("extraEnv not rendered")
	}
	cm := find[*corev1.ConfigMap](objs)[0]
	if strings.Contains(cm.Data["delayd.yaml"], "not-in-the-configmap") {
		t.Error("the Redis password is in the ConfigMap")
	}
	if sec := find[*corev1.Secret](objs); len(sec) != 1 || sec[0].StringData["redis-password"] != "not-in-the-configmap" {
		t.Error("the Redis password is not in the Secret")
	}
	if v := ps.Volumes[0].ConfigMap; v == nil || v.Name != cm.Name {
		t.Errorf("config volume does not point at ConfigMap %s", cm.Name)
	}
}

// TestHelmSchemaRejects: values.schema.json refuses what would render a
// broken or unsafe release.
func TestHelmSchemaRejects(t *testing.T) {
	t.Parallel()
	h := helm(t)
	for _, tc := range []struct{ set, want string }{
		{"mode=bogus", "mode"},
		{"config.nats.token=x", "secrets.natsToken"},
		{"config.nats.password=x", "secrets.natsPassword"},
		{"config.redis.password=x", "secrets.redisPassword"},
		{`config.redis\.password=x`, "redis.password"}, // a flat dotted key
		{`config.nats\.token=x`, "nats.token"},
		{"config.ui.bearer_token=x", "secrets.uiBearerToken"},
		{"config.ui.basic_auth_password=x", "secrets.uiBasicAuthPassword"},
		{"config.http.addr=", "config/http/addr"},
		{"config.http.addr=localhost:9479", "config/http/addr"}, // probes reach the pod IP
		{"config.redis.addrs[0]=redis://:pw@r:6379", "config/redis/addrs"},
		{"config.nats.url=nats://u:pw@n:4222", "config/nats/url"},
		{"secrets.redis=x", "secrets"},
		{"updateStrategy.type=Sometimes", "updateStrategy"},
		// What delayd refuses at start, refused at render.
		{"config.bogus=1", "bogus"},                         // an unknown key
		{"config.scanner.leese=10s", "leese"},               // a misspelt one
		{"config.scanner.lease=30", "lease"},                // a duration without a unit
		{"config.shutdown.timeout=45s", "shutdown.timeout"}, // longer than the pod's grace period (30s)
	} {
		out, err := tryRun(h, "template", "rel", chartDir, "--set", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %s: want a schema error naming %s, got %v\n%s", tc.set, tc.want, err, out)
		}
	}
	if _, err := tryRun(h, "template", "rel", chartDir, "--kube-version", "1.28.0"); err == nil {
		t.Error("Kubernetes 1.28 accepted: native sidecars need 1.29")
	}
}

// TestHelmSidecarPodMonitor: in sidecar mode the daemons run in the
// application's pods, which no Service of this chart selects. A
// ServiceMonitor there would render nothing while the PrometheusRule
// renders (alerts blind to the sidecars), so the schema refuses it; a
// PodMonitor selects the application's pods and labels their fleet.
func TestHelmSidecarPodMonitor(t *testing.T) {
	t.Parallel()
	h := helm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"mode=sidecar", "metrics.serviceMonitor.enabled=true"}, "metrics.podMonitor"},
		{[]string{"mode=sidecar", "metrics.podMonitor.enabled=true"}, "selector"},
		{[]string{"metrics.podMonitor.enabled=true", "metrics.podMonitor.selector.app=orders"}, "metrics.serviceMonitor"},
	} {
		args := []string{"template", "rel", chartDir}
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		if out, err := tryRun(h, args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--set %v: want a schema error naming %s, got %v\n%s", tc.set, tc.want, err, out)
		}
	}
	objs := decodeStrict(t, template(t, chartDir, "--set", "mode=sidecar", "--set", "metrics.podMonitor.enabled=true",
		"--set", "metrics.podMonitor.selector.app\\.kubernetes\\.io/name=orders", "--set", "metrics.prometheusRule.enabled=true"))
	pms := find[*podMonitor](objs)
	if len(pms) != 1 || len(find[*prometheusRule](objs)) != 1 {
		t.Fatalf("%d PodMonitors and %d PrometheusRules, want 1 of each", len(pms), len(find[*prometheusRule](objs)))
	}
	pm := pms[0].Spec
	if pm.Selector.MatchLabels["app.kubernetes.io/name"] != "orders" || len(pm.Selector.MatchLabels) != 1 {
		t.Errorf("PodMonitor selects %v, want the application's pods", pm.Selector.MatchLabels)
	}
	if len(pm.PodMetricsEndpoints) != 1 || pm.PodMetricsEndpoints[0].Port != "admin" || pm.PodMetricsEndpoints[0].Path != "/metrics" {
		t.Fatalf("PodMonitor endpoints %+v, want the sidecar's admin port", pm.PodMetricsEndpoints)
	}
	if r := pm.PodMetricsEndpoints[0].Relabelings; len(r) != 1 || r[0].TargetLabel != "fleet" || r[0].Replacement != "rel-delayd" {
		t.Errorf("PodMonitor relabelings %+v, want fleet=rel-delayd", r)
	}
	if n := len(find[*serviceMonitor](objs)); n != 0 {
		t.Errorf("%d ServiceMonitors in sidecar mode", n)
	}
	// In the parent chart, as users write it.
	objs = decodeStrict(t, template(t, parentChart(t), "--set", "delayd.metrics.podMonitor.enabled=true",
		"--set", "delayd.metrics.podMonitor.selector.app\\.kubernetes\\.io/name=orders"))
	if pms := find[*podMonitor](objs); len(pms) != 1 {
		t.Errorf("parent chart: %d PodMonitors", len(pms))
	}
}

// TestHelmSchemaRefusesSecretsInEnv: extraEnv (and the helm test pod's
// test.env) are plain pod spec, readable by anyone who can read the
// Deployment: a literal value under a secret's name, or a URL carrying
// credentials, is refused; the same names from a Secret are fine.
func TestHelmSchemaRefusesSecretsInEnv(t *testing.T) {
	t.Parallel()
	h := helm(t)
	dir := t.TempDir()
	render := func(i int, key, env string) error {
		values := filepath.Join(dir, fmt.Sprintf("values-%d.yaml", i))
		text := key + ": [" + env + "]\n"
		if key == "test.env" {
			text = "test: {env: [" + env + "]}\n"
		}
		writeFile(t, values, []byte(text))
		_, err := tryRun(h, "template", "rel", chartDir, "-f", values)
		return err
	}
	i := 0
	for _, key := range []string{"extraEnv", "test.env"} {
		for _, env := range []string{
			`{name: DELAYD_NATS_TOKEN, value: s3cret}`,
			`{name: DELAYD_REDIS_PASSWORD, value: s3cret}`,
			`{name: DELAYD_UI_BEARER_TOKEN, value: s3cret}`,
			`{name: DB_PASSWORD, value: s3cret}`,
			`{name: db_passwd, value: s3cret}`,
			`{name: MY_API_SECRET, value: s3cret}`,
			`{name: GITHUB_TOKEN, value: s3cret}`,
			`{name: DELAYD_NATS_URL, value: "nats://s3cret@nats:4222"}`,
			`{name: DELAYD_NATS_URL, value: "s3cret@nats:4222"}`,
			`{name: DELAYD_NATS_URL, value: "nats://a:4222,nats://u:s3cret@b:4222"}`,
			`{name: DELAYD_REDIS_ADDRS, value: "redis://:s3cret@redis:6379"}`,
			`{name: UPSTREAM, value: "https://user:s3cret@example.com/x"}`,
		} {
			i++
			if err := render(i, key, env); err == nil || !strings.Contains(err.Error(), "/"+strings.ReplaceAll(key, ".", "/")) {
				t.Errorf("%s %s: want a schema error at %s, got %v", key, env, key, err)
			}
		}
		for _, env := range []string{
			`{name: DELAYD_NATS_TOKEN, valueFrom: {secretKeyRef: {name: mine, key: token}}}`,
			`{name: DELAYD_LOG_LEVEL, value: debug}`,
			`{name: DELAYD_NATS_CREDS_FILE, value: /etc/delayd-creds/delayd.creds}`,
			`{name: DELAYD_NATS_TLS_KEY_FILE, value: /etc/tls/tls.key}`,
			`{name: DELAYD_NATS_URL, value: "nats://nats-0.nats:4222,nats://nats-1.nats:4222"}`,
			`{name: DELAYD_NATS_TOKEN, value: ""}`,
		} {
			i++
			if err := render(i, key, env); err != nil {
				t.Errorf("%s %s refused: %v", key, env, err)
			}
		}
	}
}

// TestHelmTestOwnCredentials: on an install secured as security.md says,
// the daemon's NATS user may not publish delayd.schedule, so the helm test
// pod cannot borrow the daemon's credentials. With test.existingSecret or
// test.env it gets its own, and none of the daemon's.
func TestHelmTestOwnCredentials(t *testing.T) {
	t.Parallel()
	testPod := func(args ...string) corev1.PodSpec {
		t.Helper()
		base := []string{"--set", "secrets.natsPassword=daemon-pw", "--set", "extraEnv[0].name=DELAYD_NATS_USER",
			"--set", "extraEnv[0].value=delayd", "--set", "extraVolumes[0].name=creds", "--set", "extraVolumes[0].secret.secretName=daemon-creds",
			"--set", "extraVolumeMounts[0].name=creds", "--set", "extraVolumeMounts[0].mountPath=/etc/creds"}
		pods := find[*corev1.Pod](decodeStrict(t, template(t, chartDir, append(base, args...)...)))
		if len(pods) != 1 {
			t.Fatalf("%d test pods", len(pods))
		}
		return pods[0].Spec
	}
	secretRefs := func(ps corev1.PodSpec) map[string]string {
		refs := map[string]string{}
		for _, e := range ps.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				refs[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			}
		}
		return refs
	}
	envNames := func(ps corev1.PodSpec) []string {
		var names []string
		for _, e := range ps.Containers[0].Env {
			names = append(names, e.Name+"="+e.Value)
		}
		return names
	}

	// By default, the daemon's (a cluster without per-user permissions).
	ps := testPod()
	if refs := secretRefs(ps); refs["DELAYD_NATS_PASSWORD"] != "rel-delayd/nats-password" {
		t.Errorf("default test pod secrets %v, want the daemon's", refs)
	}

	// Its own Secret: its NATS keys only, and nothing of the daemon's.
	ps = testPod("--set", "test.existingSecret=helm-test-nats", "--set", "test.env[0].name=DELAYD_NATS_USER",
		"--set", "test.env[0].value=helm-test", "--set", "test.env[1].name=DELAYD_NATS_INBOX_PREFIX", "--set", "test.env[1].value=_INBOX_helmtest")
	refs := secretRefs(ps)
	if refs["DELAYD_NATS_PASSWORD"] != "helm-test-nats/nats-password" || refs["DELAYD_NATS_TOKEN"] != "helm-test-nats/nats-token" || len(refs) != 2 {
		t.Errorf("test pod secrets %v, want nats-password and nats-token of helm-test-nats only", refs)
	}
	if names := strings.Join(envNames(ps), " "); strings.Contains(names, "DELAYD_NATS_USER=delayd") ||
		!strings.Contains(names, "DELAYD_NATS_USER=helm-test") || !strings.Contains(names, "DELAYD_NATS_INBOX_PREFIX=_INBOX_helmtest") {
		t.Errorf("test pod env %s: want test.env, not the daemon's extraEnv", names)
	}
	for _, v := range ps.Volumes {
		if v.Name == "creds" {
			t.Error("the test pod mounts the daemon's extraVolumes")
		}
	}

	// The pod's config loads without the daemon's secrets, even with a
	// console behind basic auth, whose password the pod does not get.
	objs := decodeStrict(t, template(t, chartDir, "--set", "config.ui.addr=0.0.0.0:9480", "--set", "config.ui.basic_auth_user=ops",
		"--set", "secrets.uiBasicAuthPassword=s3cret", "--set", "test.env[0].name=DELAYD_NATS_USER", "--set", "test.env[0].value=helm-test"))
	cfg := filepath.Join(t.TempDir(), "delayd.yaml")
	writeFile(t, cfg, []byte(find[*corev1.ConfigMap](objs)[0].Data["delayd.yaml"]))
	var env []string
	for _, e := range find[*corev1.Pod](objs)[0].Spec.Containers[0].Env {
		if e.ValueFrom != nil {
			t.Errorf("test pod env %s from %v, want none of the daemon's secrets", e.Name, e.ValueFrom)
		}
		env = append(env, e.Name+"="+e.Value)
	}
	getenv := func(name string) string {
		for _, kv := range env {
			if n, v, _ := strings.Cut(kv, "="); n == name {
				return v
			}
		}
		return ""
	}
	if _, err := config.Load(config.Sources{Path: cfg, Getenv: getenv, Environ: env}); err != nil {
		t.Errorf("the test pod's config does not load: %v", err)
	}

	// test.env alone (a creds file from test.volumes): no secret of the daemon.
	ps = testPod("--set", "test.env[0].name=DELAYD_NATS_CREDS_FILE", "--set", "test.env[0].value=/etc/helm-test/test.creds",
		"--set", "test.volumes[0].name=test-creds", "--set", "test.volumes[0].secret.secretName=helm-test-creds",
		"--set", "test.volumeMounts[0].name=test-creds", "--set", "test.volumeMounts[0].mountPath=/etc/helm-test")
	if refs := secretRefs(ps); len(refs) != 0 {
		t.Errorf("test pod secrets %v, want none", refs)
	}
	mounts := map[string]bool{}
	for _, m := range ps.Containers[0].VolumeMounts {
		mounts[m.Name] = true
	}
	if !mounts["test-creds"] || mounts["creds"] || !mounts["delayd-config"] {
		t.Errorf("test pod mounts %v, want delayd-config and test-creds", mounts)
	}
}
