// Package orchestra holds the ModelOrchestra domain plugins: the values
// translator, the post-renderers and the status plugin that watches.yaml
// names for the ModelOrchestra kind.
//
// Files:
//
//	doc.go             this overview
//	register.go        Register: the plugins, for the operator and the preview
//	translator.go      Translator: a resource, decoded and defaulted, to chart
//	                   values; the images the chart references
//	lifecycle.go       lifecycle values and defaults, the application's
//	                   lifecycle status from its root StatefulSet
//	sleep.go           EffectiveSleep: the sleep defaults and rules, one owner;
//	                   the cold tier's path and S3 location, Level1Tier
//	modelcopies.go     ModelCopies: which engines load the node agent's copies
//	policy.go          CheckpointPolicy lookups and the referrers to requeue
//	agentplacement.go  where the node agent runs (spec.agent or the sleeping
//	                   engines' placement)
//	sizing_values.go   the model's sizing as chart values
//	sizinggate.go      the sizing gate post-renderer
//	configchecksum.go  the config-checksum post-renderer
//	gpuscheduling.go   the gpu-scheduling post-renderer
//	proxyenv.go        the proxy-env post-renderer
//	podtemplate.go     the pod template of a rendered workload, for the
//	                   post-renderers
//	limits.go          the NATS payload and queued body limits
//	status.go          Status: the resource's status from the live objects
//	status_sleep.go    the conditions of sleeping applications
//	preview/           the offline rendering (orchestra template, values)
//	validation/        the API server's checks, offline
package orchestra
