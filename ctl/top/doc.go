// Package top turns two scrapes of an agent's metrics into rates: requests
// and errors per second for each captured Service the proxy answered,
// datapath decisions per second, and the proxy's open connections — what
// sockmeshctl top shows without a Grafana.
//
// It is pure: scrapes in, a View out. It must not scrape (agentclient
// does) or print (render does).
package top
