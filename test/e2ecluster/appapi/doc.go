// Package appapi is the wire format of the cluster tier's app client
// (../appclient), shared by the program in the pod and the tests that ask
// it: POST /call takes a Call and answers a Result; GET /inspect answers an
// Inspection.
//
// It holds types only: no client, no server, and no import that would
// grow the app client's image.
package appapi
