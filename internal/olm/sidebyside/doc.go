// Package sidebyside holds the end-to-end proof that two versions of the
// operator run at once in one cluster, the way OLM installs them in
// OwnNamespace mode: one namespace each, WATCH_NAMESPACE set to it, the
// permissions of that version's CSV granted there only, and one shared CRD.
// It has no code besides its test.
package sidebyside
