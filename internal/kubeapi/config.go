package kubeapi

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is how to reach and authenticate to one API server.
type Config struct {
	Server string      // base URL, "https://10.96.0.1:443"
	TLS    *tls.Config // roots, client certificate, server name; nil for plain HTTP
	// Token is the bearer token of each request; nil sends none.
	Token              func() (string, error)
	Username, Password string // basic authentication, when given
	// Proxy picks the HTTP proxy, as http.Transport.Proxy; nil: the environment's.
	Proxy func(*http.Request) (*url.URL, error)
}

// ServiceAccountDir is where Kubernetes mounts a pod's service account: token, ca.crt, namespace.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// InCluster is the configuration of a pod: the API server from KUBERNETES_SERVICE_HOST and
// KUBERNETES_SERVICE_PORT, the pod's service account token (read again whenever the kubelet
// rotates it) and the cluster's CA.
func InCluster() (Config, error) { return InClusterFrom(ServiceAccountDir, os.Getenv) }

// InClusterFrom is InCluster with the service account directory and the environment given.
func InClusterFrom(dir string, getenv func(string) string) (Config, error) {
	host, port := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return Config{}, errors.New("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	token := newFileToken(filepath.Join(dir, "token"))
	if _, err := token.get(); err != nil {
		return Config{}, err
	}
	roots, err := loadRoots(filepath.Join(dir, "ca.crt"), "")
	if err != nil {
		return Config{}, err
	}
	return Config{
		Server: "https://" + net.JoinHostPort(host, port),
		TLS:    &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		Token:  token.get,
	}, nil
}

// kubeconfig is the part of a kubeconfig file that is read; Unsupported* catch what is refused.
type kubeconfig struct {
	CurrentContext string `yaml:"current-context"`
	Contexts       []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	Clusters []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server                   string `yaml:"server"`
			TLSServerName            string `yaml:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `yaml:"insecure-skip-tls-verify"`
			CertificateAuthority     string `yaml:"certificate-authority"`
			CertificateAuthorityData string `yaml:"certificate-authority-data"`
			ProxyURL                 string `yaml:"proxy-url"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			Token                 string    `yaml:"token"`
			TokenFile             string    `yaml:"tokenFile"`
			ClientCertificate     string    `yaml:"client-certificate"`
			ClientCertificateData string    `yaml:"client-certificate-data"`
			ClientKey             string    `yaml:"client-key"`
			ClientKeyData         string    `yaml:"client-key-data"`
			Username              string    `yaml:"username"`
			Password              string    `yaml:"password"`
			Exec                  yaml.Node `yaml:"exec"`
			AuthProvider          yaml.Node `yaml:"auth-provider"`
			As                    string    `yaml:"as"`
			AsGroups              []string  `yaml:"as-groups"`
		} `yaml:"user"`
	} `yaml:"users"`
}

// LoadKubeconfig reads the current context of a kubeconfig file: its cluster's server,
// certificate-authority(-data), insecure-skip-tls-verify, tls-server-name and proxy-url, and its
// user's token, tokenFile, client-certificate(-data) and client-key(-data), or username and
// password. Files named in it are relative to its directory. It refuses, naming them, the
// credential plugins (exec, auth-provider) and impersonation (as, as-groups), which it does not
// implement.
func LoadKubeconfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(b, &kc); err != nil {
		return Config{}, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	fail := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("kubeconfig %s: %s", path, fmt.Sprintf(format, args...))
	}
	if kc.CurrentContext == "" {
		return fail("no current-context")
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return fail("current-context %q is not among its contexts", kc.CurrentContext)
	}
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	cfg := Config{}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	found = false
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		found = true
		cl := c.Cluster
		u, err := url.Parse(cl.Server)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fail("cluster %q: server %q is not an http(s) URL", clusterName, cl.Server)
		}
		cfg.Server = strings.TrimSuffix(cl.Server, "/")
		tlsCfg.ServerName = cl.TLSServerName
		tlsCfg.InsecureSkipVerify = cl.InsecureSkipTLSVerify
		if cl.CertificateAuthority != "" || cl.CertificateAuthorityData != "" {
			if tlsCfg.RootCAs, err = loadRoots(rel(cl.CertificateAuthority), cl.CertificateAuthorityData); err != nil {
				return fail("cluster %q: %v", clusterName, err)
			}
		}
		if cl.ProxyURL != "" {
			p, err := url.Parse(cl.ProxyURL)
			if err != nil {
				return fail("cluster %q: proxy-url: %v", clusterName, err)
			}
			cfg.Proxy = http.ProxyURL(p)
		}
	}
	if !found {
		return fail("cluster %q of context %q is not among its clusters", clusterName, kc.CurrentContext)
	}
	found = userName == "" // a context without a user: anonymous
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		found = true
		us := u.User
		switch {
		case !us.Exec.IsZero():
			return fail("user %q: exec credential plugins are not supported; give a token, tokenFile or client certificate", userName)
		case !us.AuthProvider.IsZero():
			return fail("user %q: auth-provider plugins are not supported; give a token, tokenFile or client certificate", userName)
		case us.As != "" || len(us.AsGroups) > 0:
			return fail("user %q: impersonation (as, as-groups) is not supported", userName)
		}
		switch {
		case us.Token != "":
			token := us.Token
			cfg.Token = func() (string, error) { return token, nil }
		case us.TokenFile != "":
			t := newFileToken(rel(us.TokenFile))
			if _, err := t.get(); err != nil {
				return fail("user %q: %v", userName, err)
			}
			cfg.Token = t.get
		}
		cfg.Username, cfg.Password = us.Username, us.Password
		certPEM, err := fileOrData(rel(us.ClientCertificate), us.ClientCertificateData)
		if err != nil {
			return fail("user %q: client-certificate: %v", userName, err)
		}
		keyPEM, err := fileOrData(rel(us.ClientKey), us.ClientKeyData)
		if err != nil {
			return fail("user %q: client-key: %v", userName, err)
		}
		if (certPEM == nil) != (keyPEM == nil) {
			return fail("user %q: a client certificate needs both its certificate and its key", userName)
		}
		if certPEM != nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				return fail("user %q: client certificate: %v", userName, err)
			}
			tlsCfg.Certificates = []tls.Certificate{pair}
		}
	}
	if !found {
		return fail("user %q of context %q is not among its users", userName, kc.CurrentContext)
	}
	if strings.HasPrefix(cfg.Server, "https://") {
		cfg.TLS = tlsCfg
	}
	return cfg, nil
}

// fileOrData is the base64 data when given, else the file's content, else nil.
func fileOrData(file, data string) ([]byte, error) {
	if data != "" {
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil {
			return nil, fmt.Errorf("not base64: %w", err)
		}
		return b, nil
	}
	if file == "" {
		return nil, nil
	}
	return os.ReadFile(file)
}

// loadRoots is a pool of the PEM certificates of data (base64) or, without it, of file.
func loadRoots(file, data string) (*x509.CertPool, error) {
	pem, err := fileOrData(file, data)
	if err != nil {
		return nil, fmt.Errorf("certificate authority: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("certificate authority %s: no PEM certificate in it", file)
	}
	return pool, nil
}
