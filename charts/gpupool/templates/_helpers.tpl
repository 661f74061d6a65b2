{{/* The gpupool image: repository:tag, the tag defaulting to the chart's appVersion. No
gpupool image is published: the repository is where the user pushed the one built from
deploy/Dockerfile, and the chart refuses to render without it. */}}
{{- define "gpupool.image" -}}
{{ required "image.repository is not set: gpupool publishes no image. Build it from the repository (docker build -f deploy/Dockerfile -t REGISTRY/gpupool:0.1.0 .), push it, and give --set image.repository=REGISTRY/gpupool (docs/install.md, 1. Build the image)" .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The pod-level security context of every workload but the node agent: the image's
user 65532, never root, the container runtime's default seccomp profile. */}}
{{- define "gpupool.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: {type: RuntimeDefault}
{{- end }}

{{/* The container-level security context of every container but the node agent's. */}}
{{- define "gpupool.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{/* imagePullSecrets, when given. */}}
{{- define "gpupool.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Placement of the control components (extender, scheduler, controller, webhook). */}}
{{- define "gpupool.controlPlacement" -}}
{{- with .Values.controlPlane.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The service account name a component's pods run as, as a user name. */}}
{{- define "gpupool.nodeAgentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpupool-node-agent
{{- end }}

{{/* "true" when the MPS helper runs (mps-helper.yaml): enabled, and some node's isolation
provider may be mps. */}}
{{- define "gpupool.mpsHelper" -}}
{{- if and .Values.nodeAgent.mpsHelper.enabled (has .Values.nodeAgent.isolationProvider (list "auto" "mps")) }}true{{ end }}
{{- end }}
