// Package yamldocs decodes a multi-document YAML (or JSON) stream, such as
// a manifest file of daemonset/, into its objects, in order, as the
// generic maps that server-side apply and structural checks take.
//
// It only decodes: it must not validate objects against a schema or talk
// to an API server.
package yamldocs
