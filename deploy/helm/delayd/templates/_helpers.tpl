{{- define "delayd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delayd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "delayd.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "delayd.labels" -}}
{{ include "delayd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "delayd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delayd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delayd.secretName" -}}
{{- default (include "delayd.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "delayd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "delayd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "delayd.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The admin port, from config.http.addr (":9479", "0.0.0.0:9479"). */}}
{{- define "delayd.adminPort" -}}
{{- $addr := toString (dig "http" "addr" "" .Values.config) -}}
{{- $port := regexFind "[0-9]+$" $addr -}}
{{- if not $port -}}
{{- fail (printf "config.http.addr %q has no port: probes and metrics need the admin server" $addr) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/* Every secret key delayd reads, with its environment variable. */}}
{{- define "delayd.secretEnv" -}}
{{- range $key, $env := dict "nats-password" "DELAYD_NATS_PASSWORD" "nats-token" "DELAYD_NATS_TOKEN" "redis-password" "DELAYD_REDIS_PASSWORD" "ui-bearer-token" "DELAYD_UI_BEARER_TOKEN" "ui-basic-auth-password" "DELAYD_UI_BASIC_AUTH_PASSWORD" }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ include "delayd.secretName" $ }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end -}}

{{/* Container hardening every delayd container gets, whatever the values say. */}}
{{- define "delayd.containerSecurityContext" -}}
{{- $sc := deepCopy (default (dict) .Values.securityContext) -}}
{{- $_ := set $sc "runAsNonRoot" true -}}
{{- $_ = set $sc "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- if not (hasKey $sc "allowPrivilegeEscalation") }}{{ $_ = set $sc "allowPrivilegeEscalation" false }}{{ end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/*
delayd.container renders the delayd container. Argument: a dict with
"ctx" (the delayd chart's context) and "sidecar" (bool). A native sidecar
always carries restartPolicy: Always, and its probes only ever ask /livez:
its readiness is part of the application pod's Ready condition, and an
outage of Redis or NATS must not pull every application pod out of its
Service.
*/}}
{{- define "delayd.container" -}}
{{- $ := .ctx -}}
{{- $v := $.Values -}}
{{- $ready := ternary "/livez" "/readyz" .sidecar -}}
- name: delayd
  image: {{ include "delayd.image" $ | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if .sidecar }}
  restartPolicy: Always
  {{- end }}
  args: ["run", "--config", "/etc/delayd/delayd.yaml"]
  env:
    {{- include "delayd.secretEnv" $ | trim | nindent 4 }}
    {{- with $v.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $v.envFrom }}
  envFrom: {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: admin
      containerPort: {{ include "delayd.adminPort" $ }}
      protocol: TCP
  startupProbe:
    # /livez: a pod started during a Redis or NATS outage must not be
    # killed and backed off for minutes (blocking drains under the PDB);
    # readiness keeps it out of the Service meanwhile.
    httpGet: {path: /livez, port: admin}
    {{- toYaml $v.probes.startup | nindent 4 }}
  readinessProbe:
    httpGet: {path: {{ $ready }}, port: admin}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  livenessProbe:
    # /livez never depends on Redis or NATS: an outage of either must not
    # restart every delayd at once.
    httpGet: {path: /livez, port: admin}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  resources: {{- toYaml $v.resources | nindent 4 }}
  securityContext: {{- include "delayd.containerSecurityContext" $ | nindent 4 }}
  volumeMounts:
    - {name: delayd-config, mountPath: /etc/delayd, readOnly: true}
    {{- with $v.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/*
delayd.sidecar is the native sidecar for a parent chart's pod template:
  initContainers:
    {{- include "delayd.sidecar" . | nindent 8 }}
"." may be the parent's context (delayd a dependency of the parent) or
delayd's own.
*/}}
{{- define "delayd.sidecar" -}}
{{- $ctx := . -}}
{{- if and .Subcharts (hasKey .Subcharts "delayd") }}{{ $ctx = .Subcharts.delayd }}{{ end -}}
{{- include "delayd.container" (dict "ctx" $ctx "sidecar" true) -}}
{{- end -}}

{{/*
delayd.checksum is a digest of delayd's rendered ConfigMap and Secret, for
the parent's pod annotations, so `helm upgrade` with a new delayd config
rolls the application pods (the sidecar reads its config at start):
  annotations:
    checksum/delayd: {{ include "delayd.checksum" . }}
Same "." as delayd.sidecar.
*/}}
{{- define "delayd.checksum" -}}
{{- $ := . -}}
{{- if and .Subcharts (hasKey .Subcharts "delayd") }}{{ $ = .Subcharts.delayd }}{{ end -}}
{{- $cm := toYaml $.Values.config -}}
{{- $sec := toYaml (dict "secrets" $.Values.secrets "existingSecret" $.Values.existingSecret) -}}
{{- print $cm $sec | sha256sum -}}
{{- end -}}

{{/* delayd.volumes: the volumes the delayd container mounts. Same "." as delayd.sidecar. */}}
{{- define "delayd.volumes" -}}
{{- $ := . -}}
{{- if and .Subcharts (hasKey .Subcharts "delayd") }}{{ $ = .Subcharts.delayd }}{{ end -}}
- name: delayd-config
  configMap:
    name: {{ include "delayd.fullname" $ }}
{{- with $.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Kept for charts written against 0.1: the same as delayd.volumes. */}}
{{- define "delayd.volume" -}}
{{ include "delayd.volumes" . }}
{{- end -}}

{{/*
delayd.seconds is a Go duration string ("1m30s", "500ms") in seconds, for
the checks below; the schema already refused anything else.
*/}}
{{- define "delayd.seconds" -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9.]+" . | float64 -}}
{{- $u := regexFind "(ns|us|µs|ms|s|m|h)$" . -}}
{{- $mul := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total = addf $total (mulf $n (get $mul $u)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
delayd.checkShutdown fails the render when delayd's shutdown.timeout does
not fit the pod's grace period: the kubelet would kill it mid-drain, and
what it had claimed would wait for its lease.
*/}}
{{- define "delayd.checkShutdown" -}}
{{- $timeout := 10.0 -}}
{{- with .Values.config.shutdown }}{{ with .timeout }}{{ $timeout = include "delayd.seconds" . | float64 }}{{ end }}{{ end -}}
{{- if ge $timeout (float64 .Values.terminationGracePeriodSeconds) -}}
{{- fail (printf "config.shutdown.timeout (%vs) must be shorter than terminationGracePeriodSeconds (%v), or the kubelet kills delayd mid-drain" $timeout .Values.terminationGracePeriodSeconds) -}}
{{- end -}}
{{- end -}}
