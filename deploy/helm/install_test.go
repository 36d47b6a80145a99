package helm

import (
	"io"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"helm.sh/helm/v4/pkg/strvals"
)

// install runs `helm install --dry-run=client` through the Helm v4 SDK: the schema check and
// every template, as a user's install runs them, with values from a file and --set flags.
// A test gives the chart a signing key unless its values say something of signing.
func install(t *testing.T, file string, sets ...string) error {
	t.Helper()
	vals := values(t, file)
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			t.Fatalf("--set %s: %v", s, err)
		}
	}
	return installValues(t, withSigningKey(vals))
}

// installValues runs the install with vals as they are.
func installValues(t *testing.T, vals map[string]any) error {
	t.Helper()
	cfg := &action.Configuration{
		Releases:     storage.Init(driver.NewMemory()),
		KubeClient:   &kubefake.PrintingKubeClient{Out: io.Discard},
		Capabilities: common.DefaultCapabilities,
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace = releaseName, releaseNamespace
	in.DryRunStrategy = action.DryRunClient
	_, err := in.Run(loadChart(t), vals)
	return err
}

// TestInstallRefusesBadValues: each mistake is refused by `helm install` itself, before any
// pod crash-loops, with a message naming the value to fix. The worker config cases are the
// ones the worker refuses at start (internal/config's schema test holds the two together).
func TestInstallRefusesBadValues(t *testing.T) {
	const tools = "config: {profiles: {file-summary: {tools: "
	tests := []struct {
		name   string
		values string
		set    []string
		// want are substrings of the error: the value's path and what is wrong.
		want []string
		// secret must not be in the error.
		secret string
	}{
		{name: "misspelt nats key", values: "config: {nats: {strem: X}}", want: []string{"/config/nats", "strem"}},
		{name: "path_style not a boolean", values: "config: {store: {path_style: 'yes'}}", want: []string{"/config/store/path_style"}},
		{name: "ack_wait not a duration", values: "config: {nats: {ack_wait: banana}}", want: []string{"/config/nats/ack_wait"}},
		{name: "max_deliver negative", values: "config: {nats: {max_deliver: -1}}", want: []string{"/config/nats/max_deliver"}},
		{name: "max_deliver negative by --set", set: []string{"config.nats.max_deliver=-1"}, want: []string{"/config/nats/max_deliver"}},
		{name: "unknown profile field", values: "config: {profiles: {file-summary: {timeout: 5m}}}", want: []string{"/config/profiles/file-summary", "timeout"}},
		{name: "profile without a model name", values: "config: {profiles: {extra: {tools: [{name: read_file}]}}}", want: []string{"/config/profiles/extra", "model"}},
		{name: "cpu zero", values: "config: {profiles: {file-summary: {sandbox: {cpu: '0'}}}}", want: []string{"/config/profiles/file-summary/sandbox/cpu"}},
		{name: "memory not a quantity", values: "config: {profiles: {file-summary: {sandbox: {memory: lots}}}}", want: []string{"/config/profiles/file-summary/sandbox/memory"}},
		{name: "relative workdir", values: "config: {profiles: {file-summary: {sandbox: {workdir: work}}}}", want: []string{"/config/profiles/file-summary/sandbox/workdir"}},
		{name: "unknown tool kind", values: tools + "[{name: fetch, kind: http}]}}}", want: []string{"/config/profiles/file-summary/tools/0/kind"}},
		{name: "unknown built-in tool", values: tools + "[{name: delete_file}]}}}", want: []string{"/config/profiles/file-summary/tools/0/name"}},
		{name: "built-in tool with a timeout", values: tools + "[{name: read_file, timeout: 5s}]}}}", want: []string{"/config/profiles/file-summary/tools/0/timeout"}},
		{name: "command tool with an allowlist", values: tools + "[{name: wc, command: [wc], allow: ['wc *']}]}}}", want: []string{"/config/profiles/file-summary/tools/0/allow"}},
		{name: "shell allowlist without patterns", values: tools + "[{name: shell, policy: allowlist}]}}}", want: []string{"/config/profiles/file-summary/tools/0", "allow"}},
		{name: "shell policy unknown", values: tools + "[{name: shell, policy: sometimes}]}}}", want: []string{"/config/profiles/file-summary/tools/0/policy"}},
		{name: "tool declared twice", values: tools + "[{name: read_file}, {name: read_file}]}}}", want: []string{"config.profiles.file-summary.tools[1].name", "declared twice"}},
		{name: "placeholder without parameter", values: tools + "[{name: echo, command: [echo, '{{msg}}']}]}}}", want: []string{"config.profiles.file-summary.tools[0].command", "{{msg}}"}},
		{name: "no profiles", values: "config: {profiles: {file-summary: null}}", want: []string{"/config/profiles"}},
		{name: "store not s3 or file", values: "config: {store: {url: 'ftp://x'}}", want: []string{"/config/store/url"}},
		{name: "config sets the sandbox backend", values: "config: {sandbox: {backend: bubblewrap}}", want: []string{"/config", "sandbox"}},
		{name: "config sets metrics_addr", values: "config: {metrics_addr: '127.0.0.1:9464'}", want: []string{"/config", "metrics_addr"}},
		{name: "config sets one worker id for every pod", values: "config: {worker_id: w1}", want: []string{"/config", "worker_id"}},
		{name: "keda min above max", values: "keda: {minReplicaCount: 5, maxReplicaCount: 2}", want: []string{"keda.minReplicaCount", "keda.maxReplicaCount"}},
		{name: "keda min above max by --set", set: []string{"keda.minReplicaCount=11"}, want: []string{"keda.minReplicaCount"}},
		{name: "hpa min above max", values: "autoscaling: {minReplicas: 4, maxReplicas: 3}", want: []string{"autoscaling.minReplicas"}},
		{name: "monitoring endpoint with a scheme", values: "keda: {natsServerMonitoringEndpoint: 'http://nats-headless.nats:8222'}", want: []string{"/keda/natsServerMonitoringEndpoint"}},
		{name: "monitoring endpoint with a path", values: "keda: {natsServerMonitoringEndpoint: 'nats:8222/jsz'}", want: []string{"/keda/natsServerMonitoringEndpoint"}},
		{name: "monitoring endpoint in https form", set: []string{"keda.natsServerMonitoringEndpoint=https://nats-headless.nats:8222"}, want: []string{"/keda/natsServerMonitoringEndpoint"}},
		{name: "fallback above max replicas", values: "keda: {maxReplicaCount: 3, fallback: {replicas: 4}}", want: []string{"keda.fallback.replicas", "keda.maxReplicaCount"}},
		{name: "fallback after zero failures", values: "keda: {fallback: {failureThreshold: 0}}", want: []string{"/keda/fallback/failureThreshold"}},
		{name: "keda account moved to natsServer", values: "keda: {account: $G}", want: []string{"/keda", "account"}},
		{name: "NATS namespace not a DNS label", values: "natsServer: {namespace: NATS_System}", want: []string{"/natsServer/namespace"}},
		{name: "NATS service empty", values: "natsServer: {service: ''}", want: []string{"/natsServer/service"}},
		{name: "NATS monitor port out of range", set: []string{"natsServer.monitorPort=82220"}, want: []string{"/natsServer/monitorPort"}},
		{name: "misspelt natsServer key", values: "natsServer: {namepsace: nats}", want: []string{"/natsServer", "namepsace"}},
		{name: "no-workers window not a duration", values: "metrics: {prometheusRule: {noWorkersFor: soon}}", want: []string{"/metrics/prometheusRule/noWorkersFor"}},
		{name: "scrape timeout longer than interval", values: "metrics: {serviceMonitor: {interval: 30s, scrapeTimeout: 1m}}", want: []string{"metrics.serviceMonitor.scrapeTimeout", "interval"}},
		{name: "scrape timeout longer than a mixed interval", values: "metrics: {serviceMonitor: {interval: 1m30s, scrapeTimeout: 2m}}", want: []string{"scrapeTimeout"}},
		{name: "failure ratio above 1", values: "metrics: {prometheusRule: {jobFailureRatio: 5}}", want: []string{"/metrics/prometheusRule/jobFailureRatio"}},
		{name: "failure ratio above 1 by --set", set: []string{"metrics.prometheusRule.jobFailureRatio=1.5"}, want: []string{"/metrics/prometheusRule/jobFailureRatio"}},
		{name: "replicas not a number", values: "replicas: two", want: []string{"/replicas"}},
		{name: "unknown pull policy", values: "image: {pullPolicy: Sometimes}", want: []string{"/image/pullPolicy"}},
		{name: "misspelt top-level key", values: "replica: 3", want: []string{"replica"}},
		{name: "keda flag not a boolean", values: "keda: {enabled: 'yes'}", want: []string{"/keda/enabled"}},
		{name: "sandbox namespace not a DNS label", values: "sandboxes: {namespace: Boxcar_Sandboxes}", want: []string{"/sandboxes/namespace"}},
		{name: "unknown sandbox pull policy", values: "sandboxes: {imagePullPolicy: Sometimes}", want: []string{"/sandboxes/imagePullPolicy"}},
		{name: "API key secret without a name", values: "openai: {apiKeySecret: {name: ''}}", want: []string{"/openai/apiKeySecret/name"}},
		{name: "drain grace zero", values: "drainGraceSeconds: 0", want: []string{"/drainGraceSeconds"}},
		{name: "limits memory not a quantity", values: "resources: {limits: {memory: lots}}", want: []string{"/resources/limits/memory"}},
		{name: "sandbox namespace is the release's", values: "sandboxes: {namespace: boxcar}", want: []string{"sandboxes.namespace", "the release's own namespace"}},
		{name: "sandbox namespace is the release's by --set", set: []string{"sandboxes.namespace=boxcar", "sandboxes.createNamespace=false"}, want: []string{"sandboxes.namespace"}},
		{name: "sandbox namespace is NATS's", values: "natsServer: {namespace: nats}\nsandboxes: {namespace: nats, createNamespace: false}", want: []string{"sandboxes.namespace", "natsServer.namespace"}},
		{name: "no ServiceAccount named", values: "serviceAccount: {create: false}", want: []string{"serviceAccount.name", "default ServiceAccount"}},
		{name: "the default ServiceAccount named", set: []string{"serviceAccount.create=false", "serviceAccount.name=default"}, want: []string{"serviceAccount.name"}},
		{name: "password in the NATS URL", values: "config: {nats: {url: 'nats://worker:hunter2-marker@nats.nats:4222'}}", want: []string{"config.nats.url", "natsServer.credentialsSecret"}, secret: "hunter2-marker"},
		{name: "token in the NATS URL", set: []string{"config.nats.url=nats://s3cr3t-token-marker@nats:4222"}, want: []string{"config.nats.url"}, secret: "s3cr3t-token-marker"},
		// A token with an unescaped '/' ends the authority early: it reads as a host and a path.
		{name: "token with a slash in the NATS URL", set: []string{"config.nats.url=nats://tok-slash-marker/x@nats:4222"}, want: []string{"config.nats.url"}, secret: "tok-slash-marker"},
		{name: "password with a slash in the model URL", values: "openai: {baseURL: 'https://boxcar:5551/model-slash-marker@llm.example.com/v1'}", want: []string{"openai.baseURL"}, secret: "model-slash-marker"},
		{name: "password in the model URL", values: "openai: {baseURL: 'https://boxcar:model-pw-marker@llm.example.com/v1'}", want: []string{"openai.baseURL", "openai.apiKeySecret"}, secret: "model-pw-marker"},
		{name: "token in the model URL's query", set: []string{"openai.baseURL=https://llm.example.com/v1?api_key=sk-query-marker"}, want: []string{"openai.baseURL", "openai.apiKeySecret"}, secret: "sk-query-marker"},
		{name: "model URL that does not parse, with a password", values: "openai: {baseURL: 'https://boxcar:pw%zz-model-marker@llm.example.com/v1'}", want: []string{"openai.baseURL"}, secret: "pw%zz-model-marker"},
		{name: "password in config.model.base_url", values: "config: {model: {base_url: 'https://u:cfg-model-marker@llm.example.com/v1'}}", want: []string{"config.model.base_url", "openai.apiKeySecret"}, secret: "cfg-model-marker"},
		{name: "password in the store endpoint", values: "config: {store: {endpoint: 'https://minio:store-pw-marker@minio.example.com'}}", want: []string{"config.store.endpoint", "s3.credentialsSecret"}, secret: "store-pw-marker"},
		{name: "signature in the store endpoint's query", values: "config: {store: {endpoint: 'https://minio.example.com/?X-Amz-Signature=sig-query-marker'}}", want: []string{"config.store.endpoint", "s3.credentialsSecret"}, secret: "sig-query-marker"},
		{name: "password in the store URL", values: "config: {store: {url: 's3://key:store-url-marker@boxcar'}}", want: []string{"config.store.url"}, secret: "store-url-marker"},
		{name: "NATS URL that does not parse, with a password", values: "config: {nats: {url: 'nats://worker:pw%zz-nats-marker@nats.nats:4222'}}", want: []string{"config.nats.url", "natsServer.credentialsSecret"}, secret: "pw%zz-nats-marker"},
		{name: "password in the second NATS URL", values: "config: {nats: {url: 'nats://nats-0.nats:4222,nats://worker:nats-second-marker@nats-1.nats:4222'}}", want: []string{"config.nats.url"}, secret: "nats-second-marker"},
		{name: "password in an extraEnv value", values: "extraEnv: [{name: HTTPS_PROXY, value: 'http://corp:proxy-pw-marker@proxy.corp.example:3128'}]", want: []string{"extraEnv[0].value", "valueFrom.secretKeyRef"}, secret: "proxy-pw-marker"},
		{name: "password in the runbook URL", values: "metrics: {prometheusRule: {runbookBaseURL: 'https://wiki:runbook-pw-marker@wiki.example.com/boxcar'}}", want: []string{"metrics.prometheusRule.runbookBaseURL"}, secret: "runbook-pw-marker"},
		{name: "operator credentials Secret without a key", values: "natsServer: {operatorCredentialsSecret: {name: nats-operator, key: ''}}", want: []string{"/natsServer/operatorCredentialsSecret/key"}},
		{name: "operator credentials Secret misspelt", values: "natsServer: {operatorCredentialSecret: {name: nats-operator}}", want: []string{"/natsServer", "operatorCredentialSecret"}},
		{name: "NATS credentials Secret without a key", values: "natsServer: {credentialsSecret: {name: nats-creds, key: ''}}", want: []string{"/natsServer/credentialsSecret/key"}},
		{name: "signing on without a key", values: "signing: {enabled: true}", want: []string{"submit keygen", "signing.existingSecret", "signing.enabled=false"}},
		{name: "signing key twice", values: "signing: {existingSecret: k, privateKey: \"-----BEGIN PRIVATE KEY-----\\nx\"}", want: []string{"signing.existingSecret", "signing.privateKey"}},
		{name: "signing key not PEM", values: "signing: {privateKey: ed25519-seed-marker}", want: []string{"signing.privateKey", "PEM"}, secret: "ed25519-seed-marker"},
		{name: "misspelt securityContext key", values: "securityContext: {runAsRoot: true}", want: []string{"/securityContext", "runAsRoot"}},
		{name: "podSecurityContext user not a number", values: "podSecurityContext: {runAsUser: root}", want: []string{"/podSecurityContext/runAsUser"}},
		{name: "seccomp profile type unknown", values: "podSecurityContext: {seccompProfile: {type: Default}}", want: []string{"/podSecurityContext/seccompProfile/type"}},
		{name: "extra env without a name", values: "extraEnv: [{value: x}]", want: []string{"/extraEnv/0", "name"}},
		{name: "extra env misspelt", values: "extraEnv: [{name: A, valueform: {secretKeyRef: {name: s, key: k}}}]", want: []string{"/extraEnv/0", "valueform"}},
		{name: "extra env sets the API key", values: "extraEnv: [{name: OPENAI_API_KEY, value: sk-extra-marker}]", want: []string{"extraEnv[0].name", "OPENAI_API_KEY"}, secret: "sk-extra-marker"},
		{name: "extra volume mount relative", values: "extraVolumeMounts: [{name: ca, mountPath: etc/ca}]", want: []string{"/extraVolumeMounts/0/mountPath"}},
		{name: "extra volume without a name", values: "extraVolumes: [{emptyDir: {}}]", want: []string{"/extraVolumes/0", "name"}},
		{name: "quota not a quantity", values: "sandboxes: {resourceQuota: {hard: {pods: many}}}", want: []string{"/sandboxes/resourceQuota/hard/pods"}},
		{name: "network policy peer misspelt", values: "networkPolicy: {store: {to: [{ipblock: {cidr: 10.0.0.0/8}}]}}", want: []string{"/networkPolicy/store/to/0", "ipblock"}},
		{name: "API server port out of range", values: "networkPolicy: {apiServer: {ports: [64430000]}}", want: []string{"/networkPolicy/apiServer/ports/0"}},
		{name: "runbook URL not a URL", values: "metrics: {prometheusRule: {runbookBaseURL: docs/operations.md}}", want: []string{"/metrics/prometheusRule/runbookBaseURL"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := install(t, tt.values, tt.set...)
			if err == nil {
				t.Fatalf("helm install accepts values %q --set %v, want them refused", tt.values, tt.set)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("helm install: %v\nwant the message to name %q", err, w)
				}
			}
			if tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Errorf("helm install's refusal repeats the secret %q: %v", tt.secret, err)
			}
		})
	}
}

// TestInstallAccepts: the defaults, each feature, and what a user writes on the command line.
func TestInstallAccepts(t *testing.T) {
	tests := []struct {
		name   string
		values string
		set    []string
	}{
		{name: "failure ratio by --set", set: []string{"metrics.prometheusRule.enabled=true", "metrics.prometheusRule.jobFailureRatio=0.3", "metrics.prometheusRule.sandboxStartFailureRatio=1"}},
		{name: "replica bounds by --set", set: []string{"keda.enabled=true", "keda.minReplicaCount=3", "keda.maxReplicaCount=3"}},
		{name: "quantity as a number by --set", set: []string{"config.profiles.file-summary.sandbox.cpu=2"}},
		{name: "fallback off", values: "keda: {enabled: true, fallback: {replicas: 0}}"},
		{name: "NATS named by --set", set: []string{"keda.enabled=true", "natsServer.namespace=", "natsServer.service=msg"}},
		{name: "scrape timeout equal to interval", values: "metrics: {serviceMonitor: {enabled: true, interval: 1m, scrapeTimeout: 60s}}"},
		{name: "shell tool by name", values: "config: {profiles: {file-summary: {tools: [{name: read_file}, {name: shell, policy: allowlist, allow: ['ls *']}]}}}"},
		{name: "unsigned by --set", set: []string{"signing.enabled=false"}},
		{name: "overrides by --set", set: []string{"podSecurityContext.runAsUser=10001", "securityContext.readOnlyRootFilesystem=true", "extraEnv[0].name=HTTP_PROXY", "extraEnv[0].value=http://proxy:3128"}},
		{name: "quota by --set", set: []string{"sandboxes.resourceQuota.hard.pods=100", "sandboxes.resourceQuota.hard.limits\\.cpu=64"}},
		{name: "NATS URL without credentials", values: "config: {nats: {url: 'tls://nats.nats:4222'}}"},
		{name: "command tool with its parameter", values: "config: {profiles: {file-summary: {tools: [{name: read_file}, {name: echo, command: [echo, '{{msg}}'], parameters: {type: object, properties: {msg: {type: string}}}}]}}}"},
	}
	for _, f := range features {
		tests = append(tests, struct {
			name   string
			values string
			set    []string
		}{name: f.name, values: f.values})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := install(t, tt.values, tt.set...); err != nil {
				t.Errorf("helm install refuses values %q --set %v: %v", tt.values, tt.set, err)
			}
		})
	}
}

// TestLintStrict is `helm lint --strict` for the defaults and each feature.
func TestLintStrict(t *testing.T) {
	for _, f := range features {
		t.Run(f.name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict, l.Namespace = true, releaseNamespace
			res := l.Run([]string{chartDir}, withSigningKey(values(t, f.values)))
			for _, m := range res.Messages {
				t.Logf("helm lint: %s", m)
			}
			for _, err := range res.Errors {
				t.Errorf("helm lint --strict: %v", err)
			}
		})
	}
}
