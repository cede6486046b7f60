// Package translate turns Kubernetes and Gateway API objects into a Snapshot
// and the status conditions those objects deserve.
//
// Translate is a pure function: objects in, Snapshot parts and status out. It
// must not use a client, read the clock (Input.Now is given), resolve names or
// touch the filesystem; everything it needs arrives in Input. Almost all policy
// logic lives here and is tested from YAML fixtures in testdata/.
package translate
