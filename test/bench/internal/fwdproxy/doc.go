// Package fwdproxy is the minimal transparent forwarding proxy that the
// datapath benchmark puts behind every capture mechanism (iptables REDIRECT,
// eBPF redirect), so the comparison measures the capture, not the proxy: it
// reads the original destination with origdst.Get, dials the configured
// backend with the proxy mark, and relays bytes both ways.
//
// It must stay minimal (no protocol detection, TLS or routing: that is the
// real proxy's job in userspace-proxy/) and must never relay a connection
// without original destination.
package fwdproxy
