{{/* The release's base name, at most 63 characters; a release named like the chart keeps one copy. */}}
{{- define "boxcar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* <fullname>-<.suffix> when that is at most 63 characters: a Service's name is a DNS label,
and a Job's goes into its pods' job-name label. A longer one is <the fullname cut>-<the first 8
hex digits of the whole fullname's SHA-256>-<.suffix>, 63 characters, so that two fullnames
alike in what is kept still name two objects. */}}
{{- define "boxcar.suffixed" -}}
{{- $full := include "boxcar.fullname" .root -}}
{{- if le (add (len $full) (len .suffix) 1) 63 -}}
{{- printf "%s-%s" $full .suffix -}}
{{- else -}}
{{- printf "%s-%s-%s" ($full | trunc (int (sub 53 (len .suffix))) | trimSuffix "-") ($full | sha256sum | trunc 8) .suffix -}}
{{- end -}}
{{- end -}}

{{- define "boxcar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "boxcar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: boxcar
{{- end -}}

{{- define "boxcar.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "boxcar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "boxcar.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The labels the kubernetes sandbox backend puts on every sandbox pod
(internal/sandbox/kubernetes.go: LabelManagedBy, LabelComponent). The NetworkPolicy selects
them; deploy/helm/chart_test.go holds the two to each other.
*/}}
{{- define "boxcar.sandboxSelectorLabels" -}}
app.kubernetes.io/managed-by: boxcar
app.kubernetes.io/component: sandbox
{{- end -}}

{{/* The DNS domain of natsServer's namespace: <namespace>.svc.<clusterDomain>. */}}
{{- define "boxcar.natsDomain" -}}
{{- printf "%s.svc.%s" (.Values.natsServer.namespace | default .Release.Namespace) .Values.natsServer.clusterDomain -}}
{{- end -}}

{{/* The workers' model endpoint: config.model.base_url, which the worker takes over its
OPENAI_BASE_URL (openai.baseURL), else that. The workers' NetworkPolicy opens its port and
BoxcarModelDown names it. */}}
{{- define "boxcar.modelURL" -}}
{{- dig "model" "base_url" "" .Values.config | default .Values.openai.baseURL -}}
{{- end -}}

{{/* The ports the workers' egress proxy dials for sandboxes, as a JSON list: each profile's
network.allow entry's ("host:port"), and "any" for an entry that names none ("host", every
port). The proxy checks the host names; a NetworkPolicy can only name ports and peers. */}}
{{- define "boxcar.sandboxEgressPorts" -}}
{{- $ports := list -}}
{{- range $name, $p := .Values.config.profiles -}}
{{- range (dig "network" "allow" list ($p | default dict)) -}}
{{- $port := regexFind ":[0-9]+$" (toString .) | trimPrefix ":" -}}
{{- /* Decimal, as the proxy reads it: 08443 is 8443, where the int function fails on it. */ -}}
{{- $ports = append $ports (regexReplaceAll "^0+([0-9])" $port "${1}" | default "any") -}}
{{- end -}}
{{- end -}}
{{- toJson ($ports | uniq | sortAlpha) -}}
{{- end -}}

{{/* Any address but those nothing legitimate is, as NetworkPolicy peers: the ranges the
workers' egress proxy refuses whatever egress.allowed_cidrs lifts (internal/egress's hard rows:
loopback, link-local and cloud metadata, multicast, broadcast, the metadata and platform
endpoints outside link-local), and the CIDRs of the list . besides; each IPv4 one in its NAT64
form too (64:ff9b::/96), where a NAT64 gateway dials the IPv4 address. */}}
{{- define "boxcar.anyAddressBut" -}}
{{- $v4 := list "0.0.0.0/8" "127.0.0.0/8" "169.254.0.0/16" "224.0.0.0/4" "255.255.255.255/32" "100.100.100.200/32" "168.63.129.16/32" -}}
{{- $v6 := list "::/128" "::1/128" "fe80::/10" "ff00::/8" "fd00:ec2::254/128" "fd20:ce::254/128" -}}
{{- range . -}}
{{- if contains ":" . }}{{ $v6 = append $v6 . }}{{ else }}{{ $v4 = append $v4 . }}{{ end -}}
{{- end -}}
{{- range $v4 }}{{ $v6 = append $v6 (include "boxcar.nat64" .) }}{{ end -}}
{{- toYaml (list (dict "ipBlock" (dict "cidr" "0.0.0.0/0" "except" (uniq $v4))) (dict "ipBlock" (dict "cidr" "::/0" "except" (uniq $v6)))) -}}
{{- end -}}

{{/* The IPv4 CIDR . (a.b.c.d/n) in the well-known NAT64 prefix, 64:ff9b::/96 (RFC 6052): the
address's two halves in hex after it, /96+n, written as Go writes an IPv6 prefix. */}}
{{- define "boxcar.nat64" -}}
{{- $parts := regexSplit "[./]" . -1 -}}
{{- $hi := add (mul (index $parts 0 | int) 256) (index $parts 1 | int) -}}
{{- $lo := add (mul (index $parts 2 | int) 256) (index $parts 3 | int) -}}
{{- $addr := printf "64:ff9b::%x:%x" $hi $lo -}}
{{- if and (eq $hi 0) (eq $lo 0) }}{{ $addr = "64:ff9b::" }}{{ else if eq $hi 0 }}{{ $addr = printf "64:ff9b::%x" $lo }}{{ end -}}
{{- printf "%s/%d" $addr (add 96 (index $parts 4 | int)) -}}
{{- end -}}

{{/* The addresses the workers' egress proxy may dial for a sandbox, as NetworkPolicy peers:
boxcar.anyAddressBut networkPolicy.exceptCIDRs. The rules for an endpoint given by host name
take them too (boxcar.endpointEgress): nothing legitimate is there. */}}
{{- define "boxcar.proxyDialable" -}}
{{- include "boxcar.anyAddressBut" .Values.networkPolicy.exceptCIDRs -}}
{{- end -}}

{{/* The endpoints of a comma-separated list of URLs, as a JSON list: each one's host (an IPv6
literal without its brackets), its port (its own, else its scheme's) and ip, "4" or "6" for
an IP literal, else "", as the workers' clients read them: a part without a scheme is
nats://part, as the NATS client reads it; a scheme in capitals is the scheme (Go's URL parser
lowers it); an IPv4 address written as IPv6 ([::ffff:10.0.0.1], or in hex [::ffff:a00:1]) is
the IPv4 address, where the packets go; a port's leading zeros are nothing (Go dials "010" as
10, where the int function reads it as octal 8). */}}
{{- define "boxcar.urlEndpoints" -}}
{{- $list := list -}}
{{- $hexDigit := dict "0" 0 "1" 1 "2" 2 "3" 3 "4" 4 "5" 5 "6" 6 "7" 7 "8" 8 "9" 9 "a" 10 "b" 11 "c" 12 "d" 13 "e" 14 "f" 15 -}}
{{- range splitList "," (toString .) -}}
{{- $part := trim . -}}
{{- if $part -}}
{{- if not (contains "://" $part) }}{{ $part = printf "nats://%s" $part }}{{ end -}}
{{- $u := fromJson (include "boxcar.urlParts" $part) -}}
{{- $port := regexFind ":[0-9]+$" $u.host | trimPrefix ":" -}}
{{- $host := regexReplaceAll ":[0-9]*$" $u.host "" -}}
{{- if hasPrefix "[" $u.host }}{{ $host = regexReplaceAll "^\\[(.*)\\](:[0-9]*)?$" $u.host "${1}" | lower }}{{ end -}}
{{- $v4mapped := "^(?:(?:0{1,4}:){5}|(?:(?:0{1,4}:)+|:):(?:0{1,4}:)*)ffff:" -}}
{{- if regexMatch (print $v4mapped "[0-9]+(?:\\.[0-9]+){3}$") $host }}{{ $host = regexReplaceAll $v4mapped $host "" }}
{{- else if regexMatch (print $v4mapped "[0-9a-f]{1,4}:[0-9a-f]{1,4}$") $host }}
{{- $bytes := list -}}
{{- range regexReplaceAll $v4mapped $host "" | splitList ":" }}
{{- $n := 0 }}{{ range splitList "" . }}{{ $n = add (mul $n 16) (index $hexDigit .) }}{{ end }}
{{- $bytes = append (append $bytes (div $n 256)) (mod $n 256) }}
{{- end }}
{{- $host = join "." $bytes }}
{{- end -}}
{{- $ip := "" -}}
{{- if regexMatch "^[0-9]+(\\.[0-9]+){3}$" $host }}{{ $ip = "4" }}{{ else if contains ":" $host }}{{ $ip = "6" }}{{ end -}}
{{- $port = $port | default (get (dict "http" "80" "https" "443" "nats" "4222" "tls" "4222" "ws" "80" "wss" "443") (lower $u.scheme)) | default "443" -}}
{{- $list = append $list (dict "host" $host "port" (regexReplaceAll "^0+([0-9])" $port "${1}" | int) "ip" $ip) -}}
{{- end -}}
{{- end -}}
{{- toJson $list -}}
{{- end -}}

{{/* The workers' NetworkPolicy egress rules to the endpoints of .urls (a comma-separated list
of URLs), one rule for each endpoint's port, on TCP or on each of .protocols: to .to when it
names peers, else to where the
endpoint may be: an IP literal's own address; a Service name's (<service>.<namespace>.svc…)
namespace's pods; for any other host name, any address but those nothing legitimate is
(boxcar.proxyDialable: link-local with cloud metadata, loopback, multicast and
networkPolicy.exceptCIDRs), or the cluster's pods, which some implementations' ipBlocks never
match. A Service's cluster IP given as an IP literal matches no implementation's ipBlock, as
the traffic reaches them addressed to the Service's pods: name the Service, or set .to. */}}
{{- define "boxcar.endpointEgress" -}}
{{- $rules := list -}}
{{- range fromJsonArray (include "boxcar.urlEndpoints" .urls) -}}
{{- $to := $.to -}}
{{- if $to }}
{{- else if eq .ip "4" }}{{ $to = list (dict "ipBlock" (dict "cidr" (printf "%s/32" .host))) }}
{{- else if eq .ip "6" }}{{ $to = list (dict "ipBlock" (dict "cidr" (printf "%s/128" .host))) }}
{{- else if $ns := include "boxcar.serviceNamespace" (dict "host" .host "root" $.root) }}
{{- $to = list (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" $ns))) }}
{{- else }}{{ $to = append (include "boxcar.proxyDialable" $.root | fromYamlArray) (dict "namespaceSelector" dict) }}
{{- end }}
{{- $ports := list -}}
{{- $port := .port -}}
{{- range ($.protocols | default (list "TCP")) }}{{ $ports = append $ports (dict "port" $port "protocol" .) }}{{ end -}}
{{- $rule := dict "ports" $ports "to" $to -}}
{{- if not (has $rule $rules) }}{{ $rules = append $rules $rule }}{{ end -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* The namespace of .host when it is the DNS name of a Service in the cluster, or of one of
its pods: <service>.<namespace>.svc or <pod>.<service>.<namespace>.svc, under the cluster's
domain (natsServer.clusterDomain, with or without the final dot) or with none, in any case;
else "". Any other name is no Service's, one with a ".svc." under another domain among them
(store.svc.example.com): its rule is a host name's anywhere. A name two labels long
(minio.storage) may be a Service's through the pods' search domains, or a public one
(example.com), so it too takes a host name's rule, which reaches the cluster's pods. */}}
{{- define "boxcar.serviceNamespace" -}}
{{- $label := "[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?" -}}
{{- $domain := .root.Values.natsServer.clusterDomain | lower | trimSuffix "." | regexQuoteMeta -}}
{{- $re := printf "^(?:%s\\.){1,2}(?P<ns>%s)\\.svc(?:\\.%s\\.?)?$" $label $label $domain -}}
{{- $host := lower .host -}}
{{- if regexMatch $re $host }}{{ regexReplaceAll $re $host "${ns}" }}{{ end -}}
{{- end -}}

{{/* The workers' NATS URL: config.nats.url, or natsServer's client Service. */}}
{{- define "boxcar.natsURL" -}}
{{- with .Values.natsServer -}}
{{- dig "nats" "url" "" $.Values.config | default (printf "nats://%s.%s:%d" .service (include "boxcar.natsDomain" $) (int .port)) -}}
{{- end -}}
{{- end -}}

{{/*
Where KEDA reads the lag: keda.natsServerMonitoringEndpoint, or natsServer's headless Service,
the one of the NATS chart that exposes the monitoring port (and whose pods' names KEDA prefixes
to find a clustered consumer's leader).
*/}}
{{- define "boxcar.natsMonitoringEndpoint" -}}
{{- with .Values.natsServer -}}
{{- $.Values.keda.natsServerMonitoringEndpoint | default (printf "%s.%s:%d" (.headlessService | default (printf "%s-headless" .service)) (include "boxcar.natsDomain" $) (int .monitorPort)) -}}
{{- end -}}
{{- end -}}

{{/* The worker configuration: the operator's config plus what the chart decides. The
worker's own image is the sandbox pods' bridge image: their init container copies the egress
tunnel from it (docs/sandbox.md), so the release's imagePullSecrets are the sandbox pods' too
(by name: each must exist in sandboxes.namespace as well). network_policy tells the workers
whether the chart made the deny-all policy, for the manifest's sandbox.isolation. */}}
{{- define "boxcar.workerConfig" -}}
{{- $k8s := dict
  "namespace" .Values.sandboxes.namespace
  "image_pull_policy" .Values.sandboxes.imagePullPolicy
  "instance" (include "boxcar.instance" .)
  "owner" (include "boxcar.sandboxObjects" .)
  "bridge_image" (include "boxcar.image" .)
  "network_policy" (ternary "deny-all" "none" .Values.sandboxes.networkPolicy.enabled)
-}}
{{- $secrets := list }}
{{- range .Values.imagePullSecrets }}
{{- $secrets = append $secrets .name }}
{{- end }}
{{- with $secrets }}
{{- $_ := set $k8s "image_pull_secrets" (uniq .) }}
{{- end }}
{{- $chart := dict
  "metrics_addr" (printf ":%d" (int .Values.metrics.port))
  "drain_grace" (printf "%ds" (int .Values.drainGraceSeconds))
  "sandbox" (dict "backend" "kubernetes" "kubernetes" $k8s)
  "nats" (dict "url" (include "boxcar.natsURL" .))
-}}
{{- toYaml (merge $chart (deepCopy .Values.config)) -}}
{{- end -}}

{{/*
The size limit of the worker's /tmp (TMPDIR): each running job spools its transcript there
(internal/runner/spool.go), at most its profile's max_transcript_bytes (the worker's default
8 MiB), and nothing else goes there: artifacts stream from the sandbox to the store. So it holds
config.concurrency (default 2) transcripts of the largest limit, in whole MiB, and 16Mi more
for the file system's blocks. The kubelet evicts a pod whose emptyDir outgrows its limit, which
would end every job of the worker, not only the one that spools the most.
*/}}
{{- define "boxcar.tmpSizeLimit" -}}
{{- $mib := 1048576 -}}
{{- $largest := 0 -}}
{{- range $name, $p := .Values.config.profiles -}}
{{- $largest = max $largest (dig "limits" "max_transcript_bytes" 0 $p | default 8388608 | int64) -}}
{{- end -}}
{{- $concurrency := .Values.config.concurrency | default 2 | int64 -}}
{{- printf "%dMi" (add 16 (mul $concurrency (div (add $largest (sub $mib 1)) $mib))) -}}
{{- end -}}

{{/*
The release as one label value, <namespace>.<release>, for sandbox.kubernetes.instance: sandbox
pods carry it and each release's workers reap only pods that do, so releases sharing a sandbox
namespace never reap each other's. Past 63 characters, a prefix and a digest of the whole.
*/}}
{{- define "boxcar.instance" -}}
{{- $v := printf "%s.%s" .Release.Namespace .Release.Name -}}
{{- if gt (len $v) 63 -}}
{{- $v = printf "%s-%s" ($v | trunc 54 | trimSuffix "-" | trimSuffix ".") ($v | sha256sum | trunc 8) -}}
{{- end -}}
{{- $v -}}
{{- end -}}

{{/*
The name of the release's objects in the sandbox namespace (the pods' owner ConfigMap, the Role
and its RoleBinding, the deny-all NetworkPolicy, the ResourceQuota):
<release namespace>.<fullname>-sandboxes. Releases may share a sandbox namespace, and two of the
same name in two namespaces have the same fullname: the namespace, which holds no dot, keeps
their objects apart, as boxcar.instance keeps their pods.
*/}}
{{- define "boxcar.sandboxObjects" -}}
{{- printf "%s.%s-sandboxes" .Release.Namespace (include "boxcar.fullname" .) -}}
{{- end -}}

{{/* The parts of a URL as RFC 3986's appendix B splits one, as JSON (scheme, host without a
user:password@, path, user, query): unlike urlParse, it never fails, and so never quotes the
URL (a password with it) in an error. user is an '@' anywhere past the scheme: a token or
password with an unescaped '/', '?' or '#' ends the authority early, and its '@' falls in the
path, query or fragment (nats://tok/en@host), as redact.URL reads one. */}}
{{- define "boxcar.urlParts" -}}
{{- $re := "(?s)^(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\\?([^#]*))?(#(.*))?$" -}}
{{- $authority := regexReplaceAll $re . "${4}" -}}
{{- toJson (dict "scheme" (regexReplaceAll $re . "${2}") "host" (regexReplaceAll "^.*@" $authority "") "path" (regexReplaceAll $re . "${5}") "user" (contains "@" (regexReplaceAll $re . "${3}${5}${6}${8}")) "query" (ne (regexReplaceAll $re . "${6}") "")) -}}
{{- end -}}

{{/* A URL as an alert or a note may show it: scheme, host and path, never a user:password@ or
a query (an api-key= parameter), as redact.URL shows one in the worker's logs. */}}
{{- define "boxcar.shownURL" -}}
{{- $u := fromJson (include "boxcar.urlParts" .) -}}
{{- if and $u.scheme $u.host -}}
{{- printf "%s://%s%s" $u.scheme $u.host $u.path -}}
{{- else if or (contains "@" .) (contains "?" .) -}}
[a URL that does not parse; see config.model.base_url or openai.baseURL]
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* "user" when a URL of the comma-separated list holds a user:password@ or a token@ (one
without a scheme read as scheme://part, as the NATS client reads it), "query" when one holds
a query; "" when neither. */}}
{{- define "boxcar.urlCredentials" -}}
{{- $found := dict -}}
{{- range splitList "," (toString .) -}}
{{- $part := trim . -}}
{{- if not (contains "://" $part) }}{{ $part = printf "x://%s" $part }}{{ end -}}
{{- $u := fromJson (include "boxcar.urlParts" $part) -}}
{{- if $u.user }}{{ $_ := set $found "user" true }}{{ end -}}
{{- if $u.query }}{{ $_ := set $found "query" true }}{{ end -}}
{{- end -}}
{{- keys $found | sortAlpha | join "," -}}
{{- end -}}

{{/* Refuses a secret in a value that lands in a pod spec, a ConfigMap or an alert: a URL's
user:password@ and, where the value has no use for one, its query (an api_key=, a signature).
The refusal names the value and where the secret belongs, never the value. */}}
{{- define "boxcar.checkURLSecrets" -}}
{{- $model := "put the model's API key in the Secret openai.apiKeySecret names (the worker sends it as a bearer token, and the model client drops a base URL's query) and give the URL as scheme://host/path alone" -}}
{{- $s3 := "put the S3 keys in the Secret s3.credentialsSecret names (or leave its name empty to use the pod's workload identity) and give the URL without them" -}}
{{- $nats := "put them in a Secret and set natsServer.credentialsSecret.name (a .creds file, mounted and given as --nats-creds)" -}}
{{- range list
  (list "openai.baseURL" .Values.openai.baseURL "the worker Deployment's pod spec" $model true)
  (list "config.model.base_url" (dig "model" "base_url" "" .Values.config) "the worker ConfigMap" $model true)
  (list "config.store.url" (dig "store" "url" "" .Values.config) "the worker ConfigMap" $s3 true)
  (list "config.store.endpoint" (dig "store" "endpoint" "" .Values.config) "the worker ConfigMap" $s3 true)
  (list "config.nats.url" (include "boxcar.natsURL" .) "the worker ConfigMap" $nats true)
  (list "metrics.prometheusRule.runbookBaseURL" .Values.metrics.prometheusRule.runbookBaseURL "every alert's annotations" "give the runbooks' address alone" false) }}
{{- $found := include "boxcar.urlCredentials" (index . 1) -}}
{{- if or (contains "user" $found) (and (index . 4) (contains "query" $found)) }}
{{- fail (printf "%s holds credentials in its URL (a user:password@ or a token@%s), which would sit in %s for anyone who can read it: %s. Its value is not shown here" (index . 0) (ternary ", or a query such as ?api_key=" "" (index . 4)) (index . 2) (index . 3)) }}
{{- end }}
{{- end }}
{{- range $i, $e := .Values.extraEnv }}
{{- if regexMatch "[A-Za-z][A-Za-z0-9+.-]*://[^/?#\\s]*@" (toString $e.value) }}
{{- fail (printf "extraEnv[%d].value (%s) holds a URL with a user:password@, which would sit in the worker Deployment's pod spec for anyone who can read it: give the variable with valueFrom.secretKeyRef from a Secret instead. Its value is not shown here" $i $e.name) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret that holds the manifest signing key: signing.existingSecret, or the chart's own. */}}
{{- define "boxcar.signingSecret" -}}
{{- .Values.signing.existingSecret | default (include "boxcar.suffixed" (dict "root" . "suffix" "signing")) -}}
{{- end -}}

{{/* Selector that scopes alert and dashboard queries to this release's workers. */}}
{{- define "boxcar.promSelector" -}}
namespace="{{ .Release.Namespace }}",service="{{ include "boxcar.suffixed" (dict "root" . "suffix" "metrics") }}"
{{- end -}}

{{- define "boxcar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The checks values.schema.json has no words for: one value against another, and the two worker
config rules JSON Schema cannot state (internal/config.Schema says which). Each failure names
the value to change.
*/}}
{{- define "boxcar.checks" -}}
{{- if eq .Values.sandboxes.namespace .Release.Namespace }}
{{- fail (printf "sandboxes.namespace is %q, the release's own namespace: sandbox pods run untrusted commands and must not share a namespace with the workers and their Secrets (the API key, S3 and signing keys); set sandboxes.namespace to another, e.g. %s-sandboxes" .Values.sandboxes.namespace .Release.Namespace) }}
{{- end }}
{{- if eq .Values.sandboxes.namespace .Values.natsServer.namespace }}
{{- fail (printf "sandboxes.namespace is %q, natsServer.namespace too: the deny-all NetworkPolicy there would cut the NATS server off from the workers, and the workers' Role lets them exec into and delete every pod there; set sandboxes.namespace to a namespace of its own, e.g. %s-sandboxes" .Values.sandboxes.namespace .Release.Namespace) }}
{{- end }}
{{- if and (not .Values.serviceAccount.create) (has (.Values.serviceAccount.name | default "default") (list "default")) }}
{{- fail "serviceAccount.create is false and serviceAccount.name is empty or default: the sandbox Role (create pods, exec into every tenant's sandbox pods, delete them) would be bound to the namespace's default ServiceAccount, which every pod there runs as unless told otherwise; set serviceAccount.name to a ServiceAccount made for the workers alone, or serviceAccount.create=true" }}
{{- end }}
{{- with .Values.signing }}
{{- if and .enabled (not .existingSecret) (not .privateKey) }}
{{- fail "signing.enabled is true and no key is given: manifests are signed by default. Make a key with `submit keygen --out keys`, then `kubectl -n <namespace> create secret generic boxcar-signing --from-file=signing.key=keys/signing.key` and set signing.existingSecret=boxcar-signing (keep keys/signing.pub for `submit verify`); or set signing.enabled=false to run unsigned" }}
{{- end }}
{{- if and .privateKey (not (regexMatch "^-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\n" .privateKey)) }}
{{- fail "signing.privateKey is not a PEM private key (its first line should be -----BEGIN PRIVATE KEY-----, as `submit keygen` writes it); its value is not shown here" }}
{{- end }}
{{- if and .existingSecret .privateKey }}
{{- fail "signing.existingSecret and signing.privateKey are both set: name a Secret that holds the key, or give the key for the chart's own Secret, not both" }}
{{- end }}
{{- end }}
{{- range $i, $e := .Values.extraEnv }}
{{- if has $e.name (list "OPENAI_BASE_URL" "OPENAI_API_KEY" "AWS_ACCESS_KEY_ID" "AWS_SECRET_ACCESS_KEY" "NATS_CREDS") }}
{{- fail (printf "extraEnv[%d].name: %s is the chart's to set (from openai, s3 and natsServer.credentialsSecret); a second one would silently win or lose" $i $e.name) }}
{{- end }}
{{- end }}
{{- include "boxcar.checkURLSecrets" . }}
{{- include "boxcar.checkIPBlocks" . }}
{{- with .Values.keda }}
{{- if gt (int64 .minReplicaCount) (int64 .maxReplicaCount) }}
{{- fail (printf "keda.minReplicaCount (%v) is above keda.maxReplicaCount (%v)" .minReplicaCount .maxReplicaCount) }}
{{- end }}
{{- end }}
{{- with .Values.keda }}
{{- if gt (int64 .fallback.replicas) (int64 .maxReplicaCount) }}
{{- fail (printf "keda.fallback.replicas (%v) is above keda.maxReplicaCount (%v)" .fallback.replicas .maxReplicaCount) }}
{{- end }}
{{- end }}
{{- with .Values.autoscaling }}
{{- if gt (int64 .minReplicas) (int64 .maxReplicas) }}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" .minReplicas .maxReplicas) }}
{{- end }}
{{- end }}
{{- with .Values.metrics.serviceMonitor }}
{{- if gt (include "boxcar.milliseconds" .scrapeTimeout | int64) (include "boxcar.milliseconds" .interval | int64) }}
{{- fail (printf "metrics.serviceMonitor.scrapeTimeout (%s) is longer than metrics.serviceMonitor.interval (%s); Prometheus refuses that" .scrapeTimeout .interval) }}
{{- end }}
{{- end }}
{{- range $name, $p := .Values.config.profiles }}
{{- $seen := dict }}
{{- range $i, $t := $p.tools }}
{{- $tool := toString $t.name }}
{{- if hasKey $seen $tool }}
{{- fail (printf "config.profiles.%s.tools[%d].name: %q is declared twice" $name $i $tool) }}
{{- end }}
{{- $_ := set $seen $tool true }}
{{- $props := dig "parameters" "properties" dict $t }}
{{- range $t.command }}
{{- $arg := toString . }}
{{- if regexMatch "^\\{\\{[a-zA-Z0-9_]+\\}\\}$" $arg }}
{{- if not (hasKey $props (trimSuffix "}}" (trimPrefix "{{" $arg))) }}
{{- fail (printf "config.profiles.%s.tools[%d].command: placeholder %s has no matching entry in parameters.properties" $name $i $arg) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Refuses what values.schema.json lets by (each address there is an IPv4 or IPv6 CIDR) and
the API server refuses in a NetworkPolicy's ipBlock: an except not strictly inside its cidr (of
another family, or no longer), as an exceptCIDRs of /0 would be under the rules' 0.0.0.0/0 and
::/0. Containment within a cidr of the same family and a shorter prefix is the API server's to
check. An IPv6 address written with an IPv4 part, or IPv4-mapped in hex (::ffff:a00:0/104, the
same bytes), is refused everywhere there: the API server takes an IPv4-mapped one as IPv4 (an
except of it under ::/0 is refused). */}}
{{- define "boxcar.checkIPBlocks" -}}
{{- $np := .Values.networkPolicy -}}
{{- $v4in6 := "IPv6 with an IPv4 part, or IPv4-mapped (::ffff:10.0.0.0/104, ::ffff:a00:0/104): the API server reads an IPv4-mapped one as IPv4, outside ::/0, and CNIs differ on it. Write it as IPv4 (10.0.0.0/8), or another IPv6 range in hex (64:ff9b::a00:0/120)" -}}
{{- range $i, $c := $np.exceptCIDRs -}}
{{- if include "boxcar.v4in6" $c }}
{{- fail (printf "networkPolicy.exceptCIDRs[%d] is %q, %s" $i $c $v4in6) }}
{{- end }}
{{- if hasSuffix "/0" $c }}
{{- fail (printf "networkPolicy.exceptCIDRs[%d] is %q, every address of its family: the rules by host name and the sandboxes' leave each of exceptCIDRs out of 0.0.0.0/0 and ::/0, and the API server refuses an except not strictly inside those. Give narrower ranges, or set the \"to\" of networkPolicy.nats, store, model and sandboxEgress to name the peers the workers may reach" $i $c) }}
{{- end }}
{{- end -}}
{{- $lists := dict "networkPolicy.metricsFrom" $np.metricsFrom -}}
{{- range list "dns" "nats" "store" "model" "apiServer" "sandboxEgress" -}}
{{- $_ := set $lists (printf "networkPolicy.%s.to" .) (index $np . "to") -}}
{{- end -}}
{{- range $i, $r := $np.extraEgress -}}
{{- $_ := set $lists (printf "networkPolicy.extraEgress[%d].to" $i) $r.to -}}
{{- end -}}
{{- range $name, $peers := $lists -}}
{{- range $i, $p := $peers -}}
{{- if $p.ipBlock -}}
{{- $cidr := $p.ipBlock.cidr -}}
{{- if include "boxcar.v4in6" $cidr }}
{{- fail (printf "%s[%d].ipBlock.cidr is %q, %s" $name $i $cidr $v4in6) }}
{{- end }}
{{- range $j, $e := $p.ipBlock.except -}}
{{- if include "boxcar.v4in6" $e }}
{{- fail (printf "%s[%d].ipBlock.except[%d] is %q, %s" $name $i $j $e $v4in6) }}
{{- end }}
{{- if or (ne (contains ":" $e) (contains ":" $cidr)) (le (regexFind "[0-9]+$" $e | int) (regexFind "[0-9]+$" $cidr | int)) }}
{{- fail (printf "%s[%d].ipBlock.except[%d] is %q, not strictly inside its cidr %s (of another family, or no narrower): the API server refuses such a NetworkPolicy. Give an except of the cidr's family with a longer prefix inside it, or leave it out" $name $i $j $e $cidr) }}
{{- end }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "yes" when the CIDR . is IPv6 written with an IPv4 part, or IPv4-mapped (::ffff:0:0/96) in
hex, which the API server reads as IPv4 either way; else "". */}}
{{- define "boxcar.v4in6" -}}
{{- $mapped := "^(?:(?:0{1,4}:){5}|(?:(?:0{1,4}:)+|:):(?:0{1,4}:)*)ffff:[0-9a-f]{1,4}:[0-9a-f]{1,4}/" -}}
{{- if or (and (contains ":" .) (contains "." .)) (regexMatch $mapped (lower .)) }}yes{{ end -}}
{{- end -}}

{{/* A Prometheus duration ("1m30s", "500ms") in milliseconds. */}}
{{- define "boxcar.milliseconds" -}}
{{- $unit := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 "d" 86400000 "w" 604800000 "y" 31536000000 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+(ms|s|m|h|d|w|y)" (toString .) -1 -}}
{{- $n := regexFind "^[0-9]+" . -}}
{{- $total = add $total (mul (int64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* The labels of the `worker setup` hook's Job and pod: the release's, with component setup,
so that nothing selecting the workers (the Service, the PodDisruptionBudget, the worker
NetworkPolicy) selects it. */}}
{{- define "boxcar.setupLabels" -}}
{{ include "boxcar.labels" . | replace "app.kubernetes.io/component: worker" "app.kubernetes.io/component: setup" }}
{{- end -}}

{{- define "boxcar.setupSelectorLabels" -}}
{{ include "boxcar.selectorLabels" . | replace "app.kubernetes.io/component: worker" "app.kubernetes.io/component: setup" }}
{{- end -}}

{{/* The flags of TLS to NATS (natsServer.tlsSecret), files of the nats-tls volume. */}}
{{- define "boxcar.natsTLSArgs" -}}
{{- with .Values.natsServer.tlsSecret }}
{{- if .name }}
- --nats-ca=/etc/boxcar/nats-tls/ca.crt
{{- if .certKey }}
- --nats-cert=/etc/boxcar/nats-tls/tls.crt
- --nats-key=/etc/boxcar/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The nats-tls volume: natsServer.tlsSecret's CA and, for mTLS, client certificate and key. */}}
{{- define "boxcar.natsTLSVolume" -}}
{{- with .Values.natsServer.tlsSecret }}
{{- if .name }}
- name: nats-tls
  secret:
    secretName: {{ .name }}
    defaultMode: 0440
    items:
      - key: {{ .caKey }}
        path: ca.crt
      {{- if .certKey }}
      - key: {{ .certKey }}
        path: tls.crt
      - key: {{ .keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The NetworkPolicy egress rules to DNS and NATS (networkPolicy.dns, networkPolicy.nats):
the workers' and the setup hook's. */}}
{{- define "boxcar.natsEgress" -}}
{{- with .Values.networkPolicy -}}
# DNS
- ports:
    - {port: {{ .dns.port }}, protocol: UDP}
    - {port: {{ .dns.port }}, protocol: TCP}
  {{- with .dns.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
# NATS, each server of config.nats.url, or natsServer's namespace
{{ include "boxcar.endpointEgress" (dict "urls" (include "boxcar.natsURL" $) "to" .nats.to "root" $) }}
{{- end -}}
{{- end -}}
