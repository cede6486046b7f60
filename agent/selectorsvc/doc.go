// Package selectorsvc keeps the headless Services behind EndpointSelector
// XBackends in the cluster: it creates the ones translate asks for
// (generateName, an ownerReference to the XBackend), brings drifted ones
// back to what translate wants (on every pass, the first of a leader term
// too), deletes one that has a ClusterIP so that it is generated anew
// headless, and deletes the ones sockmesh generated that are no longer
// wanted. The EndpointSlice controller then turns each
// Service's selector into endpoints, which the source hands back to
// translate (translate.Result.EndpointSelectorServices explains the
// contract).
//
// It only applies translate's wishes, and only on the leader. It never
// touches a Service that lacks sockmesh's label or an XBackend owner.
package selectorsvc
