// Command k8s-manifests checks the Kubernetes manifests in a directory: every document decodes strictly
// (no unknown field, every value of its field's type) into its kind's API type, and the objects agree with
// each other and with larder: one driver name, images on every container, the socket paths the kubelet
// and the sidecars use, the files the kustomization lists.
//
//	go run . ../../../contrib/kubernetes
package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"
)

const driver = "csi.larder.dev"

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
}

func newObject(apiVersion, kind string) (interface{}, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/PersistentVolume":
		return &corev1.PersistentVolume{}, nil
	case "v1/PersistentVolumeClaim":
		return &corev1.PersistentVolumeClaim{}, nil
	case "v1/Pod":
		return &corev1.Pod{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "storage.k8s.io/v1/CSIDriver":
		return &storagev1.CSIDriver{}, nil
	case "storage.k8s.io/v1/StorageClass":
		return &storagev1.StorageClass{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		return &rbacv1.ClusterRole{}, nil
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}, nil
	case "rbac.authorization.k8s.io/v1/Role":
		return &rbacv1.Role{}, nil
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		return &rbacv1.RoleBinding{}, nil
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &kustomization{}, nil
	}
	return nil, fmt.Errorf("unknown kind %s %s", apiVersion, kind)
}

var separator = regexp.MustCompile(`(?m)^---\s*$`)

type checker struct {
	problems []string
	objects  []interface{}
	files    map[string]bool
}

func (c *checker) fail(format string, args ...interface{}) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *checker) file(path string) {
	text, err := os.ReadFile(path)
	if err != nil {
		c.fail("%s: %v", path, err)
		return
	}
	c.files[filepath.Base(path)] = true
	for i, doc := range separator.Split(string(text), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			c.fail("%s, document %d: not YAML: %v", path, i+1, err)
			continue
		}
		obj, err := newObject(meta.APIVersion, meta.Kind)
		if err != nil {
			c.fail("%s, document %d: %v", path, i+1, err)
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			c.fail("%s, document %d (%s): %v", path, i+1, meta.Kind, err)
			continue
		}
		c.objects = append(c.objects, obj)
	}
}

func stripComments(doc string) string {
	var out bytes.Buffer
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out.WriteString(line + "\n")
		}
	}
	return out.String()
}

func (c *checker) containers(where string, spec corev1.PodSpec) {
	if len(spec.Containers) == 0 {
		c.fail("%s has no container", where)
	}
	mounts := map[string]bool{}
	for _, v := range spec.Volumes {
		mounts[v.Name] = true
	}
	for _, ct := range spec.Containers {
		if ct.Image == "" {
			c.fail("%s: container %s has no image", where, ct.Name)
		}
		for _, m := range ct.VolumeMounts {
			if !mounts[m.Name] {
				c.fail("%s: container %s mounts volume %s, which the pod does not have", where, ct.Name, m.Name)
			}
		}
	}
}

func (c *checker) agree() {
	kinds := map[string]int{}
	for _, o := range c.objects {
		switch o := o.(type) {
		case *storagev1.CSIDriver:
			kinds["CSIDriver"]++
			if o.Name != driver {
				c.fail("the CSIDriver is %q, not %q", o.Name, driver)
			}
			if o.Spec.AttachRequired == nil || *o.Spec.AttachRequired {
				c.fail("the CSIDriver must say attachRequired: false (larder has no attach step)")
			}
		case *storagev1.StorageClass:
			kinds["StorageClass"]++
			if o.Provisioner != driver {
				c.fail("StorageClass %s: provisioner %q, not %q", o.Name, o.Provisioner, driver)
			}
			if o.Parameters["home"] == "" {
				c.fail("StorageClass %s names no home", o.Name)
			}
		case *corev1.PersistentVolume:
			kinds["PersistentVolume"]++
			if o.Spec.CSI == nil || o.Spec.CSI.Driver != driver {
				c.fail("PersistentVolume %s is not a %s volume", o.Name, driver)
			} else if o.Spec.CSI.VolumeAttributes["home"] == "" {
				c.fail("PersistentVolume %s names no home", o.Name)
			}
		case *appsv1.DaemonSet:
			kinds["DaemonSet"]++
			c.containers("DaemonSet "+o.Name, o.Spec.Template.Spec)
			c.nodePlugin(o)
		case *appsv1.Deployment:
			kinds["Deployment"]++
			c.containers("Deployment "+o.Name, o.Spec.Template.Spec)
		case *corev1.Pod:
			c.containers("Pod "+o.Name, o.Spec)
		case *kustomization:
			kinds["Kustomization"]++
			for _, r := range o.Resources {
				if !c.files[r] {
					c.fail("the kustomization lists %s, which is not here", r)
				}
			}
		}
	}
	for _, k := range []string{"CSIDriver", "DaemonSet", "Deployment", "StorageClass", "PersistentVolume", "Kustomization"} {
		if kinds[k] == 0 {
			c.fail("no %s among the manifests", k)
		}
	}
}

// The node plugin: privileged, the kubelet's directory shared both ways, and the registrar pointing the
// kubelet at the socket the plugin serves.
func (c *checker) nodePlugin(ds *appsv1.DaemonSet) {
	var larder, registrar *corev1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		ct := &ds.Spec.Template.Spec.Containers[i]
		switch {
		case ct.Name == "larder":
			larder = ct
		case strings.Contains(ct.Image, "csi-node-driver-registrar"):
			registrar = ct
		}
	}
	if larder == nil || registrar == nil {
		c.fail("DaemonSet %s needs a larder container and a node-driver-registrar", ds.Name)
		return
	}
	if larder.SecurityContext == nil || larder.SecurityContext.Privileged == nil || !*larder.SecurityContext.Privileged {
		c.fail("DaemonSet %s: larder must be privileged (FUSE and bind mounts)", ds.Name)
	}
	shared := false
	for _, m := range larder.VolumeMounts {
		if m.MountPath == "/var/lib/kubelet" && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			shared = true
		}
	}
	if !shared {
		c.fail("DaemonSet %s: larder must mount /var/lib/kubelet with Bidirectional propagation", ds.Name)
	}
	want := "--kubelet-registration-path=/var/lib/kubelet/plugins/" + driver + "/csi.sock"
	found := false
	for _, a := range registrar.Args {
		found = found || a == want
	}
	if !found {
		c.fail("DaemonSet %s: the registrar must say %s", ds.Name, want)
	}
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: k8s-manifests DIR")
		os.Exit(2)
	}
	paths, _ := filepath.Glob(filepath.Join(os.Args[1], "*.yaml"))
	sort.Strings(paths)
	c := &checker{files: map[string]bool{}}
	if len(paths) == 0 {
		c.fail("no manifests in %s", os.Args[1])
	}
	for _, p := range paths {
		c.file(p)
	}
	c.agree()
	if len(c.problems) > 0 {
		for _, p := range c.problems {
			fmt.Fprintln(os.Stderr, "k8s-manifests:", p)
		}
		os.Exit(1)
	}
	fmt.Printf("k8s-manifests: %d objects in %d files decode strictly and agree\n", len(c.objects), len(paths))
}
