package main

import (
	"github.com/delayd/delayd/internal/bridge"
	"github.com/delayd/delayd/internal/config"
	"github.com/delayd/delayd/internal/store"
	"github.com/delayd/delayd/internal/tlsconf"
)

// natsAuth turns the nats.* settings into connection options.
func natsAuth(c config.Config) (bridge.Auth, error) {
	n := c.NATS
	a := bridge.Auth{User: n.User, Password: n.Password, Token: n.Token, NKeySeedFile: n.NKeySeedFile, CredsFile: n.CredsFile,
		InboxPrefix: n.InboxPrefix}
	if n.TLS.Enabled || n.TLS.CAFile != "" || n.TLS.CertFile != "" {
		t, err := tlsconf.Client(tlsconf.Files{CAFile: n.TLS.CAFile, CertFile: n.TLS.CertFile, KeyFile: n.TLS.KeyFile})
		if err != nil {
			return a, err
		}
		a.TLS = t
	}
	return a, nil
}

// redisOptions turns the redis.* settings into client options.
func redisOptions(c config.Config) (store.Options, error) {
	r := c.Redis
	o := store.Options{Addrs: r.Addrs, Username: r.Username, Password: r.Password, DB: r.DB,
		Cluster: r.Cluster, MasterName: r.MasterName}
	if r.WaitReplicas > 0 || r.WaitLocalFsync {
		o.WaitTimeout = r.WaitTimeout
	}
	if r.TLS.Enabled || r.TLS.CAFile != "" || r.TLS.CertFile != "" {
		t, err := tlsconf.Client(tlsconf.Files{CAFile: r.TLS.CAFile, CertFile: r.TLS.CertFile, KeyFile: r.TLS.KeyFile})
		if err != nil {
			return o, err
		}
		o.TLS = t
	}
	return o, nil
}
