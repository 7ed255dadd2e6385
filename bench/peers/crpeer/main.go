// crpeer: the same job as my-controller (SPEC.md section 2), written the way a
// controller-runtime user would write it, as a peer for bench/converge.py.
// Never part of the product: it exists so the benchmark can say how we compare
// with the reference implementation of the controller pattern.
//
// For each My (read as unstructured: no generated types needed):
//   - server-side apply a Deployment and a Service (field manager my-controller,
//     force), labelled and owned like ours, skipped when the cached child
//     already carries the hash of what we would apply;
//   - write the status through /status (a merge patch) when it differs:
//     observedGeneration, replicas, readyReplicas, selector, Ready condition
//     (Available / Progressing), computed from the Deployment as the apply
//     answered or the cache shows it, at once, like a typical controller;
//   - record a Created / Updated Event.
//
// Watches: My (generation changes only: our own status writes do not come
// back), Deployments and Services owned by a My. The cache holds only children
// carrying our managed-by label, as ours does.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
)

const (
	fieldManager   = "my-controller"
	hashAnnotation = "mine.jp/config-hash"
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"
)

var myGVK = schema.GroupVersionKind{Group: "mine.jp", Version: "v1", Kind: "My"}

type reconciler struct {
	client   client.Client
	cache    client.Reader
	recorder record.EventRecorder
}

// spec is the My's spec with the CRD's defaults (the apiserver applies them;
// repeated here so a hand-made object without them still works).
type spec struct {
	Image       string          `json:"image"`
	Replicas    *int64          `json:"replicas"`
	Port        int64           `json:"port"`
	ServiceType string          `json:"serviceType"`
	Env         []corev1.EnvVar `json:"env"`
	Resources   map[string]any  `json:"resources"`
}

func readSpec(my *unstructured.Unstructured) (spec, error) {
	var s spec
	raw, _, _ := unstructured.NestedMap(my.Object, "spec")
	data, err := json.Marshal(raw)
	if err == nil {
		err = json.Unmarshal(data, &s)
	}
	if s.Replicas == nil {
		one := int64(1)
		s.Replicas = &one
	}
	if s.Port == 0 {
		s.Port = 8080
	}
	if s.ServiceType == "" {
		s.ServiceType = "ClusterIP"
	}
	return s, err
}

func podLabels(name string) map[string]any {
	return map[string]any{labelName: "my", labelInstance: name}
}

// ownLabels are the children's and the pod template's labels, as controller.py's
// labels_for: the same rendered object hashes the same in both operators, so
// either finds a fleet the other made converged (bench/scale.py relies on it).
func ownLabels(name string) map[string]any {
	l := podLabels(name)
	l[labelManagedBy] = fieldManager
	return l
}

func childMeta(my *unstructured.Unstructured) map[string]any {
	return map[string]any{
		"name": my.GetName(), "namespace": my.GetNamespace(), "labels": ownLabels(my.GetName()),
		"ownerReferences": []any{map[string]any{
			"apiVersion": "mine.jp/v1", "kind": "My", "name": my.GetName(), "uid": string(my.GetUID()),
			"controller": true, "blockOwnerDeletion": true,
		}},
	}
}

// withHash stamps the apply configuration with a hash of itself, so a later
// reconcile can tell from the cache alone that nothing needs applying.
func withHash(obj map[string]any) *unstructured.Unstructured {
	data, _ := json.Marshal(obj) // map keys are sorted: deterministic
	sum := sha256.Sum256(data)
	md := obj["metadata"].(map[string]any)
	md["annotations"] = map[string]any{hashAnnotation: hex.EncodeToString(sum[:8])}
	return &unstructured.Unstructured{Object: obj}
}

func renderDeployment(my *unstructured.Unstructured, s spec) *unstructured.Unstructured {
	container := map[string]any{
		"name": "app", "image": s.Image,
		"ports": []any{map[string]any{"containerPort": s.Port, "protocol": "TCP"}},
	}
	if len(s.Env) > 0 {
		env := []any{}
		for _, e := range s.Env {
			item := map[string]any{"name": e.Name}
			if e.Value != "" {
				item["value"] = e.Value
			}
			env = append(env, item)
		}
		container["env"] = env
	}
	if len(s.Resources) > 0 {
		container["resources"] = s.Resources
	}
	return withHash(map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment", "metadata": childMeta(my),
		"spec": map[string]any{
			"replicas": *s.Replicas,
			"selector": map[string]any{"matchLabels": podLabels(my.GetName())},
			"template": map[string]any{
				"metadata": map[string]any{"labels": ownLabels(my.GetName())},
				"spec":     map[string]any{"containers": []any{container}},
			},
		},
	})
}

func renderService(my *unstructured.Unstructured, s spec) *unstructured.Unstructured {
	return withHash(map[string]any{
		"apiVersion": "v1", "kind": "Service", "metadata": childMeta(my),
		"spec": map[string]any{
			"type":     s.ServiceType,
			"selector": podLabels(my.GetName()),
			"ports":    []any{map[string]any{"port": s.Port, "targetPort": s.Port, "protocol": "TCP"}},
		},
	})
}

// ensure applies `desired` unless the cached child already carries its hash
// and is controlled by `my`. It returns the child as the server answered (or
// the cache shows it), and whether it applied.
func (r *reconciler) ensure(ctx context.Context, my *unstructured.Unstructured, desired *unstructured.Unstructured, live client.Object) (client.Object, bool, error) {
	key := client.ObjectKeyFromObject(my)
	err := r.cache.Get(ctx, key, live)
	if err == nil && metav1.IsControlledBy(live, my) &&
		live.GetAnnotations()[hashAnnotation] == desired.GetAnnotations()[hashAnnotation] {
		return live, false, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, false, err
	}
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(desired),
		client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return nil, false, err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(desired.Object, live); err != nil {
		return nil, true, err
	}
	return live, true, nil
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	my := &unstructured.Unstructured{}
	my.SetGroupVersionKind(myGVK)
	if err := r.cache.Get(ctx, req.NamespacedName, my); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if my.GetDeletionTimestamp() != nil {
		return ctrl.Result{}, nil
	}
	s, err := readSpec(my)
	if err != nil || s.Image == "" {
		return ctrl.Result{}, r.writeStatus(ctx, my, nil, &metav1.Condition{
			Type: "Ready", Status: metav1.ConditionFalse, Reason: "InvalidSpec",
			Message: fmt.Sprintf("invalid spec: %v", err)})
	}

	var created []string
	dep, applied, err := r.ensure(ctx, my, renderDeployment(my, s), &appsv1.Deployment{})
	if err != nil {
		r.recorder.Event(my, corev1.EventTypeWarning, "ReconcileError", err.Error())
		return ctrl.Result{}, err
	}
	if applied {
		created = append(created, "Deployment "+my.GetName())
	}
	_, applied, err = r.ensure(ctx, my, renderService(my, s), &corev1.Service{})
	if err != nil {
		r.recorder.Event(my, corev1.EventTypeWarning, "ReconcileError", err.Error())
		return ctrl.Result{}, err
	}
	if applied {
		created = append(created, "Service "+my.GetName())
	}
	if len(created) > 0 {
		verb := "Updated"
		if my.GetGeneration() == 1 && len(created) == 2 {
			verb = "Created"
		}
		r.recorder.Event(my, corev1.EventTypeNormal, verb, verb+" "+strings.Join(created, " and "))
	}
	return ctrl.Result{}, r.writeStatus(ctx, my, dep.(*appsv1.Deployment), nil)
}

// readiness: Available when the Deployment controller has seen this spec and
// every desired replica is updated and ready; Progressing otherwise.
func readiness(desired int64, d *appsv1.Deployment) metav1.Condition {
	c := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Progressing"}
	ready := int64(d.Status.ReadyReplicas)
	switch {
	case d.Status.ObservedGeneration < d.Generation:
		c.Message = fmt.Sprintf("%d/%d replicas ready; Deployment update pending", ready, desired)
	case ready >= desired && int64(d.Status.UpdatedReplicas) >= desired:
		c.Status, c.Reason = metav1.ConditionTrue, "Available"
		c.Message = fmt.Sprintf("%d/%d replicas ready", ready, desired)
	default:
		c.Message = fmt.Sprintf("%d/%d replicas ready", ready, desired)
	}
	return c
}

func (r *reconciler) writeStatus(ctx context.Context, my *unstructured.Unstructured, d *appsv1.Deployment, failure *metav1.Condition) error {
	s, _ := readSpec(my)
	var cond metav1.Condition
	var replicas, ready int64
	switch {
	case failure != nil:
		cond = *failure
	case d == nil:
		cond = metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Progressing",
			Message: "waiting for the Deployment to be created"}
	default:
		cond = readiness(*s.Replicas, d)
		replicas, ready = int64(d.Status.Replicas), int64(d.Status.ReadyReplicas)
	}
	cond.ObservedGeneration = my.GetGeneration()

	old, _, _ := unstructured.NestedMap(my.Object, "status")
	var conditions []metav1.Condition
	if raw, ok := old["conditions"]; ok {
		data, _ := json.Marshal(raw)
		_ = json.Unmarshal(data, &conditions)
	}
	meta.SetStatusCondition(&conditions, cond)
	status := map[string]any{
		"observedGeneration": my.GetGeneration(),
		"replicas":           replicas,
		"readyReplicas":      ready,
		"selector":           labels.SelectorFromSet(labels.Set{labelInstance: my.GetName(), labelName: "my"}).String(),
	}
	data, _ := json.Marshal(conditions)
	var condList []any
	_ = json.Unmarshal(data, &condList)
	status["conditions"] = condList
	// Compare as JSON would: unstructured numbers are int64 on one side, float on the other.
	var norm map[string]any
	data, _ = json.Marshal(status)
	_ = json.Unmarshal(data, &norm)
	var oldNorm map[string]any
	data, _ = json.Marshal(old)
	_ = json.Unmarshal(data, &oldNorm)
	same := true
	for k, v := range norm {
		if !reflect.DeepEqual(oldNorm[k], v) {
			same = false
		}
	}
	if same {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"status": norm})
	err := r.client.Status().Patch(ctx, my, client.RawPatch("application/merge-patch+json", patch))
	return client.IgnoreNotFound(err)
}

func main() {
	var metricsAddr, probeAddr, namespace string
	var workers int
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "metrics address; 0 disables")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "probe address; 0 disables")
	flag.IntVar(&workers, "workers", 4, "concurrent reconciles")
	flag.StringVar(&namespace, "namespace", "", "watch only this namespace; default: all")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("crpeer")

	var namespaces map[string]cache.Config
	if namespace != "" {
		namespaces = map[string]cache.Config{namespace: {}}
	}
	ours := labels.SelectorFromSet(labels.Set{labelManagedBy: fieldManager})
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		Cache: cache.Options{DefaultNamespaces: namespaces, ByObject: map[client.Object]cache.ByObject{
			&appsv1.Deployment{}: {Label: ours},
			&corev1.Service{}:    {Label: ours},
		}},
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	_ = mgr.AddHealthzCheck("healthz", healthz.Ping)
	_ = mgr.AddReadyzCheck("readyz", healthz.Ping)

	my := &unstructured.Unstructured{}
	my.SetGroupVersionKind(myGVK)
	r := &reconciler{client: mgr.GetClient(), cache: mgr.GetClient(),
		recorder: mgr.GetEventRecorderFor(fieldManager)}
	err = ctrl.NewControllerManagedBy(mgr).
		Named("my").
		For(my, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers}).
		Complete(r)
	if err != nil {
		log.Error(err, "controller")
		os.Exit(1)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
