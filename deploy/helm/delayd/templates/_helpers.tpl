{{- define "delayd.name" -}}delayd{{- end -}}

{{- define "delayd.fullname" -}}
{{- printf "%s-%s" .Release.Name (include "delayd.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delayd.labels" -}}
app.kubernetes.io/name: {{ include "delayd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "delayd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delayd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delayd.secretName" -}}
{{- default (include "delayd.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{/* The delayd container; in sidecar mode include it in initContainers. */}}
{{- define "delayd.container" -}}
- name: delayd
  image: "{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq .Values.mode "sidecar" }}
  restartPolicy: Always
  {{- end }}
  args: ["run", "--config", "/etc/delayd/delayd.yaml"]
  env:
    - name: DELAYD_REDIS_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ include "delayd.secretName" . }}
          key: password
          optional: true
  ports:
    - {name: admin, containerPort: 9479}
  startupProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 1
    failureThreshold: 60
  readinessProbe:
    httpGet: {path: /readyz, port: admin}
    periodSeconds: 5
  livenessProbe:
    httpGet: {path: /livez, port: admin}
    periodSeconds: 10
  resources: {{- toYaml .Values.resources | nindent 4 }}
  securityContext: {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - {name: delayd-config, mountPath: /etc/delayd, readOnly: true}
{{- end -}}

{{/* For sidecar mode: the init container plus the volume it needs. */}}
{{- define "delayd.sidecar" -}}
{{ include "delayd.container" . }}
{{- end -}}

{{- define "delayd.volume" -}}
- name: delayd-config
  configMap:
    name: {{ include "delayd.fullname" . }}
{{- end -}}
