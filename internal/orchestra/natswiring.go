package orchestra

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/plugin"
)

// NATSWiringName is the nats-wiring post-renderer's name.
const NATSWiringName = "nats-wiring"

// Environment every NATS client container gets from nats-wiring.
const (
	// EnvNATSURL is the server URL (comma-separated for several).
	EnvNATSURL = "NATS_URL"
	// EnvNATSStreamReplicas is the replica count of the stack's streams.
	EnvNATSStreamReplicas = "NATS_STREAM_REPLICAS"
	// EnvNATSCredentialsDir is the directory holding the credentials
	// Secret (its key "creds" is a NATS credentials file); it is unset when
	// the server needs no credentials.
	EnvNATSCredentialsDir = "NATS_CREDENTIALS_DIR"
)

const natsCredentialsVolume = "nats-credentials"

// AnnotationNATSConfig marks a ConfigMap whose data key (the annotation's
// value) is a YAML configuration file with NATS settings; the file's
// layout (NATSWiringConfig.ConfigFiles) says where they are. nats-wiring
// owns those settings.
const AnnotationNATSConfig = "modelorchestra.io/nats-config"

// natsCredentialsKey is the key of the credentials Secret holding the NATS
// credentials file.
const natsCredentialsKey = "creds"

// NATSWiringConfig is the nats-wiring config in watches.yaml.
type NATSWiringConfig struct {
	// ClientLabel is the pod label (value "true") marking NATS clients.
	ClientLabel string `json:"clientLabel,omitempty"`
	// CredentialsPath is where the credentials Secret is mounted.
	CredentialsPath string `json:"credentialsPath,omitempty"`
	// ConfigFiles are the layouts of the configuration files that carry
	// NATS settings, by ConfigMap data key. Default: dispatcher.yaml
	// (orchestra-dispatcher) and gateway.yaml (orchestra-gateway).
	ConfigFiles []ConfigFileLayout `json:"configFiles,omitempty"`
}

// ConfigFileLayout says where a configuration file keeps its NATS
// settings, as dotted paths of YAML keys. An empty path is not written.
type ConfigFileLayout struct {
	// Key is the ConfigMap data key holding the file.
	Key string `json:"key"`
	// URL is the path of the server URL.
	URL string `json:"url"`
	// CredentialsFile is the path of the credentials file's location; it is
	// removed when there are no credentials.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// StreamReplicas is the path of the streams' replica count.
	StreamReplicas string `json:"streamReplicas,omitempty"`
}

// defaultConfigFiles are the layouts of the project's binaries (see
// internal/dispatch.Config and internal/gateway.QueueConfig).
var defaultConfigFiles = []ConfigFileLayout{
	{Key: "dispatcher.yaml", URL: "nats.url", CredentialsFile: "nats.credentialsFile", StreamReplicas: "stream.replicas"},
	{Key: "gateway.yaml", URL: "queue.url", CredentialsFile: "queue.credsFile"},
}

// natsWiring gives every NATS client of a stack the same server URL, the
// same stream replica count and the same credentials, all resolved once
// from the resource, so that no two components can disagree.
type natsWiring struct {
	cfg     NATSWiringConfig
	layouts map[string]ConfigFileLayout
}

// NewNATSWiring builds the nats-wiring post-renderer from its config.
func NewNATSWiring(config json.RawMessage) (plugin.PostRenderer, error) {
	cfg := NATSWiringConfig{ClientLabel: "modelorchestra.io/nats-client", CredentialsPath: "/etc/orchestra/nats"}
	if err := decodeConfig(NATSWiringName, config, &cfg); err != nil {
		return nil, err
	}
	if cfg.ConfigFiles == nil {
		// Set after decoding: decoding into a filled slice would merge the
		// configured layouts into the defaults' elements.
		cfg.ConfigFiles = append([]ConfigFileLayout(nil), defaultConfigFiles...)
	}
	if cfg.ClientLabel == "" || cfg.CredentialsPath == "" || cfg.CredentialsPath[0] != '/' {
		return nil, fmt.Errorf("post-renderer %s: config: clientLabel must be set and credentialsPath must be absolute", NATSWiringName)
	}
	layouts := map[string]ConfigFileLayout{}
	for i, l := range cfg.ConfigFiles {
		if l.Key == "" || l.URL == "" {
			return nil, fmt.Errorf("post-renderer %s: config: configFiles[%d]: key and url are required", NATSWiringName, i)
		}
		if _, dup := layouts[l.Key]; dup {
			return nil, fmt.Errorf("post-renderer %s: config: configFiles[%d]: key %q is listed twice", NATSWiringName, i, l.Key)
		}
		layouts[l.Key] = l
	}
	return &natsWiring{cfg: cfg, layouts: layouts}, nil
}

// natsConnection is what every client is told.
type natsConnection struct {
	url               string
	streamReplicas    int32
	credentialsSecret string
}

// ResolveNATS returns the NATS URL of a resource: spec.nats.url, or the
// in-cluster server's Service, named "<resource>-nats" by the chart.
func resolveNATS(owner *unstructured.Unstructured) (natsConnection, string, error) {
	mo, err := Decode(owner)
	if err != nil {
		return natsConnection{}, "", err
	}
	n := mo.Spec.NATS
	conn := natsConnection{url: n.URL, streamReplicas: n.Replicas}
	if n.CredentialsSecretRef != nil {
		conn.credentialsSecret = n.CredentialsSecretRef.Name
	}
	service := ""
	if conn.url == "" {
		service = owner.GetName() + "-nats"
		conn.url = fmt.Sprintf("nats://%s.%s.svc:4222", service, owner.GetNamespace())
	}
	return conn, service, nil
}

// PostRender implements plugin.PostRenderer.
func (n *natsWiring) PostRender(_ context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	if rc.Owner == nil {
		return nil, fmt.Errorf("%s: no owner resource to resolve NATS from", NATSWiringName)
	}
	conn, service, err := resolveNATS(rc.Owner)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", NATSWiringName, err)
	}
	clients := 0
	serviceFound := service == ""
	for _, obj := range objs {
		if obj.GetKind() == "Service" && obj.GetAPIVersion() == "v1" && obj.GetName() == service {
			serviceFound = true
		}
		if key, ok := obj.GetAnnotations()[AnnotationNATSConfig]; ok && obj.GetKind() == "ConfigMap" {
			clients++
			if err := n.wireConfigFile(obj, key, conn); err != nil {
				return nil, fmt.Errorf("%s: ConfigMap %s: %w", NATSWiringName, obj.GetName(), err)
			}
		}
		pt, err := podTemplateOf(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", NATSWiringName, err)
		}
		if pt == nil || pt.tmpl.Labels[n.cfg.ClientLabel] != "true" {
			continue
		}
		clients++
		n.wire(&pt.tmpl.Spec, conn)
		if err := pt.store(); err != nil {
			return nil, fmt.Errorf("%s: %w", NATSWiringName, err)
		}
	}
	if clients > 0 && !serviceFound {
		return nil, fmt.Errorf("%s: the in-cluster NATS URL %s names Service %s, which the chart did not render", NATSWiringName, conn.url, service)
	}
	return objs, nil
}

// wireConfigFile sets the NATS settings of the configuration file held in
// data key key of the ConfigMap obj, where its layout says.
func (n *natsWiring) wireConfigFile(obj *unstructured.Unstructured, key string, conn natsConnection) error {
	layout, ok := n.layouts[key]
	if !ok {
		return fmt.Errorf("annotation %s names %q, a file without a configured layout", AnnotationNATSConfig, key)
	}
	raw, found, err := unstructured.NestedString(obj.Object, "data", key)
	if err != nil || !found {
		return fmt.Errorf("annotation %s names data key %q, which it does not have", AnnotationNATSConfig, key)
	}
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(raw), &doc); err != nil {
		return fmt.Errorf("data key %q is not YAML: %w", key, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	set := func(path string, v any) error {
		if path == "" {
			return nil
		}
		if v == nil {
			unstructured.RemoveNestedField(doc, strings.Split(path, ".")...)
			return nil
		}
		if err := unstructured.SetNestedField(doc, v, strings.Split(path, ".")...); err != nil {
			return fmt.Errorf("data key %q: setting %s: %w", key, path, err)
		}
		return nil
	}
	var creds any
	if conn.credentialsSecret != "" {
		creds = path.Join(n.cfg.CredentialsPath, natsCredentialsKey)
	}
	if err := set(layout.URL, conn.url); err != nil {
		return err
	}
	if err := set(layout.CredentialsFile, creds); err != nil {
		return err
	}
	if err := set(layout.StreamReplicas, int64(conn.streamReplicas)); err != nil {
		return err
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return fmt.Errorf("encoding data key %q: %w", key, err)
	}
	return unstructured.SetNestedField(obj.Object, string(out), "data", key)
}

func (n *natsWiring) wire(spec *corev1.PodSpec, conn natsConnection) {
	// Volume: present exactly when there are credentials.
	vols := spec.Volumes[:0]
	for _, v := range spec.Volumes {
		if v.Name != natsCredentialsVolume {
			vols = append(vols, v)
		}
	}
	spec.Volumes = vols
	if conn.credentialsSecret != "" {
		mode := int32(0o440)
		spec.Volumes = append(spec.Volumes, corev1.Volume{
			Name: natsCredentialsVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: conn.credentialsSecret, DefaultMode: &mode,
			}},
		})
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		setEnv(c, EnvNATSURL, conn.url)
		setEnv(c, EnvNATSStreamReplicas, strconv.Itoa(int(conn.streamReplicas)))
		mounts := c.VolumeMounts[:0]
		for _, m := range c.VolumeMounts {
			if m.Name != natsCredentialsVolume {
				mounts = append(mounts, m)
			}
		}
		c.VolumeMounts = mounts
		if conn.credentialsSecret != "" {
			setEnv(c, EnvNATSCredentialsDir, n.cfg.CredentialsPath)
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: natsCredentialsVolume, MountPath: n.cfg.CredentialsPath, ReadOnly: true})
		} else {
			unsetEnv(c, EnvNATSCredentialsDir)
		}
	}
}

// setEnv sets name to value in c, in place when present (so that $(VAR)
// references in later variables keep resolving), appended otherwise.
func setEnv(c *corev1.Container, name, value string) {
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i] = corev1.EnvVar{Name: name, Value: value}
			return
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
}

func unsetEnv(c *corev1.Container, name string) {
	env := c.Env[:0]
	for _, e := range c.Env {
		if e.Name != name {
			env = append(env, e)
		}
	}
	c.Env = env
}
