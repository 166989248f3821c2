package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"

	"github.com/model-orchestra/operator/internal/orchestra/preview"
	"github.com/model-orchestra/operator/internal/render"
)

func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

const resource = `apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: cli}
spec:
  applications:
    chat: {model: {source: "hf://org/repo", file: m.gguf}}
`

func TestTemplateFromStdin(t *testing.T) {
	out, err := run(t, resource, "template", "-f", "-", "-n", "team", "--set", "spec.gateway.replicas=3")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: StatefulSet", "name: cli-gateway\n  namespace: team", "replicas: 3"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

func TestTemplateRefusesInvalidResource(t *testing.T) {
	_, err := run(t, resource, "template", "-f", "-", "--set", "spec.applications.chat.runtime.engine=tgi")
	if err == nil || !strings.Contains(err.Error(), "spec.applications.chat.runtime.engine") {
		t.Fatalf("error = %v, want one naming spec.applications.chat.runtime.engine", err)
	}
}

func TestTemplateRefusesSmallNATSStorage(t *testing.T) {
	_, err := run(t, resource, "template", "-f", "-", "--set", "spec.nats.storage.size=1536Mi")
	if err == nil || !strings.Contains(err.Error(), "spec.nats.storage.size") || !strings.Contains(err.Error(), "at least 2Gi") {
		t.Fatalf("error = %v, want one naming spec.nats.storage.size and the 2Gi minimum", err)
	}
}

func TestTemplateNeedsFile(t *testing.T) {
	if _, err := run(t, "", "template"); err == nil || !strings.Contains(err.Error(), "--file") {
		t.Fatalf("error = %v, want one asking for --file", err)
	}
}

const samplesDir = "../../config/samples"

// TestHelmPreviewIsTemplate: for every sample, helm template of the chart
// with the values `orchestra values` prints and `orchestra post-render` as
// its post-renderer renders exactly the objects `orchestra template` prints,
// which are what the operator applies. It runs the real helm when
// bin/helm exists (hack/tools/install.sh helm), and otherwise, or with
// -short, Helm's own install action, client-only, as helm template does.
//
// A proxy is set, as OLM sets one in the operator's environment, so that
// proxy-env changes the objects compared, as gpu-scheduling (GPU samples)
// and config-checksum do; helm passes the environment on to the
// post-render command.
func TestHelmPreviewIsTemplate(t *testing.T) {
	const proxyURL = "http://proxy.example:3128"
	t.Setenv("HTTP_PROXY", proxyURL)
	t.Setenv("HTTPS_PROXY", proxyURL)
	t.Setenv("NO_PROXY", ".svc,.cluster.local")
	for _, v := range []string{"http_proxy", "https_proxy", "no_proxy"} {
		t.Setenv(v, "") // the upper-case ones above are the proxy
		if err := os.Unsetenv(v); err != nil {
			t.Fatal(err)
		}
	}
	samples, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples in %s (%v)", samplesDir, err)
	}
	helm := helmTemplater(t)
	for _, sample := range samples {
		t.Run(strings.TrimSuffix(filepath.Base(sample), ".yaml"), func(t *testing.T) {
			want, err := run(t, "", "template", "-f", sample)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(want, proxyURL) {
				t.Fatalf("orchestra template gave no pod the proxy %s: the proxy-env post-renderer did not run", proxyURL)
			}
			values, err := run(t, "", "values", "-f", sample)
			if err != nil {
				t.Fatal(err)
			}
			valuesFile := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(valuesFile, []byte(values), 0o600); err != nil {
				t.Fatal(err)
			}
			name, namespace := resourceName(t, sample)
			got := helm(t, name, namespace, valuesFile, sample)
			if diff := cmp.Diff(objects(t, want), objects(t, got)); diff != "" {
				t.Errorf("helm template with orchestra values and post-render differs from orchestra template (-template +helm):\n%s", diff)
			}
		})
	}
}

// helmTemplater returns a function that runs
//
//	helm template NAME ../../charts/model-orchestra -n NAMESPACE -f VALUES
//	  --post-renderer orchestra --post-renderer-args post-render --post-renderer-args -f --post-renderer-args CR
//
// and returns its output.
func helmTemplater(t *testing.T) func(t *testing.T, name, namespace, values, cr string) string {
	binDir := os.Getenv("MO_BIN_DIR")
	if binDir == "" {
		binDir = "../../bin"
	}
	helmBin, err := filepath.Abs(filepath.Join(binDir, "helm"))
	if err != nil {
		t.Fatal(err)
	}
	if testing.Short() {
		t.Log("-short: running Helm's install action client-only, not bin/helm and a built orchestra")
		return helmInProcess
	}
	if _, err := os.Stat(helmBin); err != nil {
		t.Logf("no helm in %s (hack/tools/install.sh helm builds it): running Helm's install action client-only instead", binDir)
		return helmInProcess
	}
	orchestra := filepath.Join(t.TempDir(), "orchestra")
	if out, err := exec.Command("go", "build", "-o", orchestra, ".").CombinedOutput(); err != nil {
		t.Fatalf("building orchestra: %v\n%s", err, out)
	}
	return func(t *testing.T, name, namespace, values, cr string) string {
		t.Helper()
		cmd := exec.Command(helmBin, "template", name, chartDir, "-n", namespace, "-f", values,
			"--kube-version", preview.DefaultKubeVersion,
			"--post-renderer", orchestra, "--post-renderer-args", "post-render",
			"--post-renderer-args", "-f", "--post-renderer-args", cr)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
		}
		return string(out)
	}
}

const chartDir = "../../charts/model-orchestra"

// helmInProcess is what helm template does, with the post-render command
// run in-process as the post-renderer.
func helmInProcess(t *testing.T, name, namespace, values, cr string) string {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ReadValuesFile(values)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := chartutil.ParseKubeVersion(preview.DefaultKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = name
	install.Namespace = namespace
	install.KubeVersion = kv
	install.PostRenderer = postRenderCommand{t: t, cr: cr}
	rel, err := install.Run(c, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return rel.Manifest
}

// postRenderCommand runs `orchestra post-render -f cr` as Helm runs its
// --post-renderer executable: manifests on standard input, the result on
// standard output.
type postRenderCommand struct {
	t  *testing.T
	cr string
}

func (p postRenderCommand) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	out, err := run(p.t, in.String(), "post-render", "-f", p.cr)
	if err != nil {
		return nil, err
	}
	return bytes.NewBufferString(out), nil
}

// resourceName returns the name and namespace of the ModelOrchestra in
// file, which may also hold the CheckpointPolicies it uses.
func resourceName(t *testing.T, file string) (name, namespace string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.ParseManifest(string(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "ModelOrchestra" {
			continue
		}
		if name != "" {
			t.Fatalf("%s holds more than one ModelOrchestra", file)
		}
		name, namespace = o.GetName(), o.GetNamespace()
	}
	if name == "" {
		t.Fatalf("%s holds no ModelOrchestra", file)
	}
	if namespace == "" {
		namespace = "default"
	}
	return name, namespace
}

// objects parses a manifest into its objects, in order.
func objects(t *testing.T, manifest string) []map[string]any {
	t.Helper()
	objs, err := render.ParseManifest(manifest)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.Object)
	}
	if len(out) == 0 {
		t.Fatal("the manifest holds no objects")
	}
	return out
}

// TestPostRenderRefusesAnotherRelease: the operator names the release after
// the resource, so a manifest rendered under another release name would
// preview objects the operator never applies.
func TestPostRenderRefusesAnotherRelease(t *testing.T) {
	cr := filepath.Join(t.TempDir(), "cr.yaml")
	if err := os.WriteFile(cr, []byte(resource), 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other-gateway\n  namespace: default\n  labels: {app.kubernetes.io/instance: other}\n"
	_, err := run(t, manifest, "post-render", "-f", cr)
	if err == nil || !strings.Contains(err.Error(), `release "other"`) || !strings.Contains(err.Error(), "helm template cli") {
		t.Fatalf("error = %v, want one naming release other and the command with the resource's name cli", err)
	}
}

func TestPostRenderNeedsTheResourceInAFile(t *testing.T) {
	if _, err := run(t, "", "post-render", "-f", "-"); err == nil || !strings.Contains(err.Error(), "standard input carries the manifests") {
		t.Fatalf("error = %v, want one saying that standard input carries the manifests", err)
	}
}

func TestValuesOfOneResource(t *testing.T) {
	out, err := run(t, resource, "values", "-f", "-", "-n", "team")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"url: nats://cli-nats.team.svc:4222", "secretSelector: modelorchestra.io/api-token=true", "maxConcurrent: 16"} {
		if !strings.Contains(out, want) {
			t.Errorf("values lack %q:\n%s", want, out)
		}
	}
	if _, err := run(t, resource+"---\n"+resource, "values", "-f", "-"); err == nil || !strings.Contains(err.Error(), "holds 2 resources") {
		t.Fatalf("error = %v, want one refusing two resources", err)
	}
}
