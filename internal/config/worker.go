package config

import (
	"fmt"
	"net"
	"strconv"
)

// validateWorker checks the keys of the worker itself that were checked only when used: a bad
// metrics_addr stopped the worker when /metrics started, a worker_id the kubernetes backend
// cannot label a pod with when the backend started.
func (c Config) validateWorker() []error {
	var errs []error
	if err := CheckMetricsAddr(c.MetricsAddr); err != nil {
		errs = append(errs, &FieldError{Path: "metrics_addr", Msg: err.Error()})
	}
	if c.Sandbox.Backend == "kubernetes" && (c.WorkerID == "" || !labelValue.MatchString(c.WorkerID)) {
		errs = append(errs, &FieldError{Path: "worker_id", Msg: fmt.Sprintf("%q is not a label value, which the kubernetes backend labels each sandbox pod with: letters, digits, -_. between two letters or digits, at most 63 (unset, it is the host name)", c.WorkerID)})
	}
	return errs
}

// CheckMetricsAddr checks a metrics_addr or --metrics-addr as the worker will listen on it:
// off, or host:port with a port number, so that a bad one stops the worker at load and not
// when /metrics starts.
func CheckMetricsAddr(addr string) error {
	if addr == "off" {
		return nil
	}
	const fix = "give 127.0.0.1:9464 (this machine only), :9464 (every address) or off"
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port; %s", addr, fix)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q has no port number from 0 to 65535; %s", addr, fix)
	}
	return nil
}
