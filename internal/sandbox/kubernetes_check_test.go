package sandbox_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"syscall"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

func TestKubernetesCheck(t *testing.T) {
	tests := []struct {
		name     string
		listErr  error
		deny     string // "verb resource/subresource" the access review refuses
		wantErr  string // empty: Check succeeds
		wantNoAR bool   // no access review is asked
		// notSay is what the error must not say: a remedy for another cause.
		notSay string
	}{
		{name: "allowed"},
		{name: "cannot list", listErr: apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", nil), wantErr: "list pods in namespace " + testNamespace, wantNoAR: true},
		// What the API server's answer says, where the Role was named whatever it said.
		{name: "API server silent", listErr: &url.Error{Op: "Get", URL: "https://10.96.0.1:443/api/v1/namespaces/" + testNamespace + "/pods", Err: syscall.ECONNREFUSED},
			wantErr: "the API server does not answer", notSay: "Role", wantNoAR: true},
		{name: "API server overloaded", listErr: apierrors.NewTooManyRequests("slow down", 1), wantErr: "asks the worker to slow down", notSay: "Role", wantNoAR: true},
		{name: "API server failing", listErr: apierrors.NewInternalError(errors.New("etcd")), wantErr: "the API server failed to answer", notSay: "Role", wantNoAR: true},
		{name: "no exec", deny: "create pods/exec", wantErr: "may not create pods/exec in namespace " + testNamespace},
		{name: "no create", deny: "create pods/", wantErr: "may not create pods in namespace"},
		{name: "no patch", deny: "patch pods/", wantErr: "may not patch pods in namespace"},
		// A start waits for its pod through a watch, which the chart's Role grants: a Role
		// without it went unreported.
		{name: "no watch", deny: "watch pods/", wantErr: "may not watch pods in namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				return tt.listErr != nil, nil, tt.listErr
			})
			var reviews []string
			client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
				r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
				ra := r.Spec.ResourceAttributes
				key := ra.Verb + " " + ra.Resource + "/" + ra.Subresource
				reviews = append(reviews, key+" in "+ra.Namespace)
				r = r.DeepCopy()
				r.Status.Allowed = key != tt.deny
				if !r.Status.Allowed {
					r.Status.Reason = "no RBAC rule"
				}
				return true, r, nil
			})
			p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{Client: client, Executor: noExec{}, Namespace: testNamespace})
			if err != nil {
				t.Fatal(err)
			}
			err = p.Check(context.Background())
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Check: %v, want nil", err)
			case tt.wantErr != "" && !errors.Is(err, sandbox.ErrUnavailable):
				t.Fatalf("Check: %v, want ErrUnavailable", err)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				// The message is what an operator reads on /readyz: it must name the fix.
				t.Fatalf("Check: %v, want it to say %q", err, tt.wantErr)
			case tt.notSay != "" && strings.Contains(err.Error(), tt.notSay):
				t.Errorf("Check: %v, want it not to say %q", err, tt.notSay)
			}
			if tt.wantNoAR && len(reviews) > 0 {
				t.Errorf("access reviews %v asked after the list failed", reviews)
			}
			if !tt.wantNoAR && len(reviews) != 5 {
				t.Errorf("access reviews = %v, want create pods, create pods/exec, delete pods, patch pods, watch pods", reviews)
			}
			for _, r := range reviews {
				if !strings.HasSuffix(r, " in "+testNamespace) {
					t.Errorf("access review %q is not about namespace %s", r, testNamespace)
				}
			}
		})
	}
}
