// Command goplugin-host loads a Ferry plugin binary the way Velero does and checks its answers.
//
// It is Ferry's proof that Velero can load a plugin served by the Rust SDK: the plugin is
// launched by hashicorp/go-plugin's client with Velero's handshake, listed through Velero's own
// plugin registry, and called through Velero's own plugin manager and gRPC clients. Any answer
// that differs from what the example plugin (crates/ferry-plugin/tests/bin/example_plugin.rs)
// is written to return makes the program exit non-zero.
//
// Usage, mirroring `velero server`:
//
//	goplugin-host server --plugin-dir DIR [--log-level LEVEL] [--features LIST] [other flags]
//	goplugin-host ferry --plugin-dir DIR --pvc FILE --backup FILE [--wait DURATION] [flags]
//
// The `ferry` mode drives Ferry's own data mover plugin (the `ferry` binary installed as a
// Velero plugin) against a real cluster: ListPlugins through Velero's registry, then the PVC
// backup action through Velero's plugin manager (AppliesTo, Execute on the PVC of FILE for the
// Backup of FILE, Progress until the operation completes) and prints what Velero saw as one
// JSON object on stdout, for the Rust test to check against the cluster.
//
// Like Velero, the host passes its own flags (everything after the first argument) on to every
// plugin process it starts, and it starts itself with `run-plugins` to list its built-in plugins
// (it has none) before the binaries found in the plugin directory.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	hclog "github.com/hashicorp/go-hclog"
	hcplugin "github.com/hashicorp/go-plugin"
	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt/process"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework/common"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
)

// The plugins the example plugin lists to Velero, by kind. It also serves
// "ferry.dev/echo-snapshotter" as a VolumeSnapshotterV2, a kind Velero does not know: Velero's
// plugin lister rejects unknown kinds (failing the discovery of every plugin), so the plugin
// lists that kind only to hosts that set FERRY_PLUGIN_EXTRA_KINDS, which Velero never does.
var expectedPlugins = map[common.PluginKind][]string{
	common.PluginKindBackupItemAction:    {"ferry.dev/echo-backup-v1"},
	common.PluginKindBackupItemActionV2:  {"ferry.dev/echo-backup", "ferry.dev/echo-backup-v1-adapted"},
	common.PluginKindRestoreItemAction:   {"ferry.dev/echo-restore-v1"},
	common.PluginKindRestoreItemActionV2: {"ferry.dev/echo-restore"},
	common.PluginKindDeleteItemAction:    {"ferry.dev/echo-delete"},
	common.PluginKindVolumeSnapshotter:   {"ferry.dev/echo-snapshotter"},
}

type checker struct {
	failures int
}

func (c *checker) equal(what string, got, want any) {
	if reflect.DeepEqual(got, want) {
		fmt.Printf("ok   %s: %v\n", what, got)
		return
	}
	c.failures++
	fmt.Printf("FAIL %s:\n       got  %#v\n       want %#v\n", what, got, want)
}

func (c *checker) noError(what string, err error) bool {
	if err == nil {
		return true
	}
	c.failures++
	fmt.Printf("FAIL %s: %v\n", what, err)
	return false
}

func (c *checker) errorContains(what string, err error, parts ...string) {
	if err == nil {
		c.failures++
		fmt.Printf("FAIL %s: expected an error, got none\n", what)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			c.failures++
			fmt.Printf("FAIL %s: error %q does not mention %q\n", what, err.Error(), p)
			return
		}
	}
	fmt.Printf("ok   %s: %v\n", what, err)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: goplugin-host server --plugin-dir DIR [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run-plugins":
		// What `velero run-plugins` does for Velero's built-in plugins; this host has none.
		framework.NewServer().BindFlags(pflag.CommandLine).Serve()
	case "server":
		os.Exit(runServer())
	case "ferry":
		os.Exit(runFerry())
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

func runServer() int {
	flags := pflag.NewFlagSet("server", pflag.ContinueOnError)
	pluginDir := flags.String("plugin-dir", "", "directory holding the plugin binaries")
	flags.String("log-level", "info", "passed on to plugins")
	flags.String("features", "", "passed on to plugins")
	flags.ParseErrorsAllowlist.UnknownFlags = true
	if err := flags.Parse(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if *pluginDir == "" {
		fmt.Fprintln(os.Stderr, "--plugin-dir is required")
		return 2
	}

	logger := logrus.New()
	logger.Out = os.Stderr
	logger.Level = logrus.DebugLevel

	c := &checker{}
	checkRawGoPlugin(c, *pluginDir)
	checkThroughVelero(c, logger, *pluginDir)

	if c.failures > 0 {
		fmt.Printf("%d check(s) failed\n", c.failures)
		return 1
	}
	fmt.Println("all checks passed")
	return 0
}

// checkRawGoPlugin launches the plugin with go-plugin's client and Velero's handshake, and checks
// the negotiated protocol, the health service (go-plugin's Ping) and ListPlugins.
func checkRawGoPlugin(c *checker, dir string) {
	binaries, err := filepath.Glob(filepath.Join(dir, "*"))
	if !c.noError("list plugin directory", err) || len(binaries) != 1 {
		c.equal("plugin binaries in the directory", len(binaries), 1)
		return
	}
	client := hcplugin.NewClient(&hcplugin.ClientConfig{
		HandshakeConfig:  framework.Handshake(),
		AllowedProtocols: []hcplugin.Protocol{hcplugin.ProtocolGRPC},
		Plugins: map[string]hcplugin.Plugin{
			string(common.PluginKindPluginLister): &framework.PluginListerPlugin{},
		},
		Cmd:    exec.Command(binaries[0], os.Args[2:]...),
		Logger: hclog.New(&hclog.LoggerOptions{Name: "raw", Output: os.Stderr, Level: hclog.Debug}),
	})
	defer client.Kill()

	rpc, err := client.Client()
	if !c.noError("go-plugin handshake", err) {
		return
	}
	c.equal("negotiated protocol version", client.NegotiatedVersion(), 2)
	c.equal("go-plugin Ping (health of service \"plugin\")", rpc.Ping(), nil)

	raw, err := rpc.Dispense(string(common.PluginKindPluginLister))
	if !c.noError("dispense PluginLister", err) {
		return
	}
	ids, err := raw.(framework.PluginLister).ListPlugins()
	if !c.noError("ListPlugins", err) {
		return
	}
	got := map[common.PluginKind][]string{}
	for _, id := range ids {
		c.equal("ListPlugins command of "+id.Name, id.Command, binaries[0])
		got[id.Kind] = append(got[id.Kind], id.Name)
	}
	for kind := range got {
		sort.Strings(got[kind])
	}
	c.equal("ListPlugins", got, expectedPlugins)

	client.Kill()
	c.equal("plugin process exited after Kill", client.Exited(), true)
}

// checkThroughVelero discovers the plugins with Velero's registry and calls them through
// Velero's plugin manager, exactly as the Velero server does during backups and restores.
func checkThroughVelero(c *checker, logger *logrus.Logger, dir string) {
	registry := process.NewRegistry(dir, logger, logger.Level)
	if !c.noError("registry.DiscoverPlugins", registry.DiscoverPlugins()) {
		return
	}
	for kind, names := range expectedPlugins {
		var got []string
		for _, id := range registry.List(kind) {
			got = append(got, id.Name)
		}
		sort.Strings(got)
		want := names
		if kind == common.PluginKindBackupItemActionV2 {
			// Velero lists v1 BackupItemActions under v2 too (it adapts them on the host side).
			want = append([]string{}, names...)
			want = append(want, expectedPlugins[common.PluginKindBackupItemAction]...)
			sort.Strings(want)
		}
		if kind == common.PluginKindRestoreItemActionV2 {
			want = append([]string{}, names...)
			want = append(want, expectedPlugins[common.PluginKindRestoreItemAction]...)
			sort.Strings(want)
		}
		c.equal("registry.List("+string(kind)+")", got, want)
	}

	manager := clientmgmt.NewManager(logger, logger.Level, registry)
	defer manager.CleanupClients()

	backup := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "nightly"}}
	restore := &velerov1.Restore{ObjectMeta: metav1.ObjectMeta{Namespace: "velero", Name: "nightly-restore"}}

	checkBackupItemActionV2(c, manager, backup)
	checkAdaptedV1BackupItemAction(c, manager, backup)
	checkRestoreItemActionV2(c, manager, restore)
	checkVolumeSnapshotter(c, manager)
}

func pvc(namespace, name, volume string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "PersistentVolumeClaim",
		"metadata":   map[string]any{"namespace": namespace, "name": name},
		"spec":       map[string]any{"volumeName": volume},
	}}
}

func checkBackupItemActionV2(c *checker, manager clientmgmt.Manager, backup *velerov1.Backup) {
	bia, err := manager.GetBackupItemActionV2("ferry.dev/echo-backup")
	if !c.noError("GetBackupItemActionV2(ferry.dev/echo-backup)", err) {
		return
	}
	selector, err := bia.AppliesTo()
	if c.noError("BIA v2 AppliesTo", err) {
		c.equal("BIA v2 AppliesTo", selector, velero.ResourceSelector{
			IncludedResources: []string{"persistentvolumeclaims"},
			LabelSelector:     "ferry.dev/echo=true",
		})
	}

	updated, additional, operationID, postOperation, err := bia.Execute(pvc("apps", "data", "pv-1"), backup)
	if !c.noError("BIA v2 Execute", err) {
		return
	}
	annotations := updated.(*unstructured.Unstructured).GetAnnotations()
	c.equal("BIA v2 Execute item annotation", annotations["ferry.dev/echoed-by"], "nightly")
	c.equal("BIA v2 Execute item name", updated.(*unstructured.Unstructured).GetName(), "data")
	c.equal("BIA v2 Execute additional items", additional, []velero.ResourceIdentifier{{
		GroupResource: schema.GroupResource{Group: "", Resource: "persistentvolumes"},
		Name:          "pv-1",
	}})
	c.equal("BIA v2 Execute operation ID", operationID, "echo/apps/data")
	c.equal("BIA v2 Execute post-operation items", postOperation, []velero.ResourceIdentifier{{
		GroupResource: schema.GroupResource{Group: "velero.io", Resource: "datauploads"},
		Namespace:     "velero",
		Name:          "nightly-data",
	}})

	progress, err := bia.Progress(operationID, backup)
	if c.noError("BIA v2 Progress", err) {
		c.equal("BIA v2 Progress", progress, velero.OperationProgress{
			Completed:      true,
			NCompleted:     4096,
			NTotal:         4096,
			OperationUnits: "bytes",
			Description:    "echoed apps/data for backup nightly",
			Started:        time.Unix(1_700_000_000, 0).UTC(),
			Updated:        time.Unix(1_700_000_060, 0).UTC(),
		})
	}
	_, err = bia.Progress("no-such-operation", backup)
	c.errorContains("BIA v2 Progress of an unknown operation", err, "no-such-operation")

	c.noError("BIA v2 Cancel", bia.Cancel(operationID, backup))
	progress, err = bia.Progress(operationID, backup)
	if c.noError("BIA v2 Progress after Cancel", err) {
		c.equal("BIA v2 Progress after Cancel: completed", progress.Completed, true)
		c.equal("BIA v2 Progress after Cancel: error", progress.Err, "cancelled by the host")
	}

	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "PersistentVolumeClaim"}}
	_, _, _, _, err = bia.Execute(bad, backup)
	c.errorContains("BIA v2 Execute of an item without a name", err, "ferry.dev/echo-backup", "metadata.name")
}

func checkAdaptedV1BackupItemAction(c *checker, manager clientmgmt.Manager, backup *velerov1.Backup) {
	// A v1 action: Velero adapts it to v2 on the host side and calls the v1 service.
	bia, err := manager.GetBackupItemActionV2("ferry.dev/echo-backup-v1")
	if !c.noError("GetBackupItemActionV2(ferry.dev/echo-backup-v1)", err) {
		return
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": "apps", "name": "settings"},
	}}
	updated, additional, operationID, _, err := bia.Execute(cm, backup)
	if c.noError("BIA v1 Execute", err) {
		c.equal("BIA v1 Execute item annotation",
			updated.(*unstructured.Unstructured).GetAnnotations()["ferry.dev/echoed-by-v1"], "nightly")
		c.equal("BIA v1 Execute additional items", len(additional), 0)
		c.equal("BIA v1 Execute operation ID", operationID, "")
	}

	// The same v1 action served as v2 by Ferry's SDK adapter.
	adapted, err := manager.GetBackupItemActionV2("ferry.dev/echo-backup-v1-adapted")
	if !c.noError("GetBackupItemActionV2(ferry.dev/echo-backup-v1-adapted)", err) {
		return
	}
	selector, err := adapted.AppliesTo()
	if c.noError("adapted BIA AppliesTo", err) {
		c.equal("adapted BIA AppliesTo", selector.IncludedResources, []string{"configmaps"})
	}
	updated, _, operationID, postOperation, err := adapted.Execute(cm, backup)
	if c.noError("adapted BIA Execute", err) {
		c.equal("adapted BIA Execute item annotation",
			updated.(*unstructured.Unstructured).GetAnnotations()["ferry.dev/echoed-by-v1"], "nightly")
		c.equal("adapted BIA Execute operation ID", operationID, "")
		c.equal("adapted BIA Execute post-operation items", len(postOperation), 0)
	}
	c.noError("adapted BIA Cancel", adapted.Cancel("", backup))
}

func checkRestoreItemActionV2(c *checker, manager clientmgmt.Manager, restore *velerov1.Restore) {
	ria, err := manager.GetRestoreItemActionV2("ferry.dev/echo-restore")
	if !c.noError("GetRestoreItemActionV2(ferry.dev/echo-restore)", err) {
		return
	}
	out, err := ria.Execute(&velero.RestoreItemActionExecuteInput{
		Item:           pvc("apps-copy", "data", ""),
		ItemFromBackup: pvc("apps", "data", "pv-1"),
		Restore:        restore,
	})
	if !c.noError("RIA v2 Execute", err) {
		return
	}
	c.equal("RIA v2 Execute item annotation",
		out.UpdatedItem.(*unstructured.Unstructured).GetAnnotations()["ferry.dev/restored-by"], "nightly-restore")
	c.equal("RIA v2 Execute operation ID", out.OperationID, "echo-restore/apps-copy/data")
	c.equal("RIA v2 Execute wait for additional items", out.WaitForAdditionalItems, true)
	c.equal("RIA v2 Execute additional items ready timeout", out.AdditionalItemsReadyTimeout, 90*time.Second)
	c.equal("RIA v2 Execute skip restore", out.SkipRestore, false)
	c.equal("RIA v2 Execute additional items", out.AdditionalItems, []velero.ResourceIdentifier{{
		GroupResource: schema.GroupResource{Group: "", Resource: "persistentvolumes"},
		Name:          "pv-1",
	}})

	ready, err := ria.AreAdditionalItemsReady(out.AdditionalItems, restore)
	if c.noError("RIA v2 AreAdditionalItemsReady", err) {
		c.equal("RIA v2 AreAdditionalItemsReady", ready, true)
	}
	ready, err = ria.AreAdditionalItemsReady([]velero.ResourceIdentifier{{
		GroupResource: schema.GroupResource{Resource: "persistentvolumes"}, Name: "pending-pv",
	}}, restore)
	if c.noError("RIA v2 AreAdditionalItemsReady (pending)", err) {
		c.equal("RIA v2 AreAdditionalItemsReady (pending)", ready, false)
	}

	progress, err := ria.Progress(out.OperationID, restore)
	if c.noError("RIA v2 Progress", err) {
		c.equal("RIA v2 Progress", progress, velero.OperationProgress{
			Completed:      true,
			NCompleted:     4096,
			NTotal:         4096,
			OperationUnits: "bytes",
			Description:    "restored apps-copy/data for restore nightly-restore",
			Started:        time.Unix(1_700_000_000, 0).UTC(),
			Updated:        time.Unix(1_700_000_060, 0).UTC(),
		})
	}
	c.noError("RIA v2 Cancel", ria.Cancel(out.OperationID, restore))
}

func checkVolumeSnapshotter(c *checker, manager clientmgmt.Manager) {
	// Velero's restartable snapshotter records its config before calling Init, so a failed Init
	// is checked on an instance of its own.
	failing, err := manager.GetVolumeSnapshotter("ferry.dev/echo-snapshotter")
	if c.noError("GetVolumeSnapshotter(ferry.dev/echo-snapshotter)", err) {
		c.errorContains("VolumeSnapshotter Init without region", failing.Init(map[string]string{}), "region")
	}
	vs, err := manager.GetVolumeSnapshotter("ferry.dev/echo-snapshotter")
	if !c.noError("GetVolumeSnapshotter(ferry.dev/echo-snapshotter)", err) {
		return
	}
	if !c.noError("VolumeSnapshotter Init", vs.Init(map[string]string{"region": "eu-1"})) {
		return
	}
	snapshotID, err := vs.CreateSnapshot("vol-1", "eu-1a", map[string]string{"velero.io/backup": "nightly"})
	if c.noError("VolumeSnapshotter CreateSnapshot", err) {
		c.equal("VolumeSnapshotter CreateSnapshot", snapshotID, "snap-vol-1")
	}
	volumeType, iops, err := vs.GetVolumeInfo("vol-1", "eu-1a")
	if c.noError("VolumeSnapshotter GetVolumeInfo", err) {
		c.equal("VolumeSnapshotter GetVolumeInfo type", volumeType, "gp3")
		if iops == nil {
			c.equal("VolumeSnapshotter GetVolumeInfo iops", "nil", "3000")
		} else {
			c.equal("VolumeSnapshotter GetVolumeInfo iops", *iops, int64(3000))
		}
	}
	volumeID, err := vs.CreateVolumeFromSnapshot("snap-vol-1", "gp3", "eu-1b", nil)
	if c.noError("VolumeSnapshotter CreateVolumeFromSnapshot", err) {
		c.equal("VolumeSnapshotter CreateVolumeFromSnapshot", volumeID, "vol-from-snap-vol-1")
	}
	pv := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "PersistentVolume",
		"metadata": map[string]any{"name": "pv-1"},
		"spec":     map[string]any{"csi": map[string]any{"driver": "ferry.dev", "volumeHandle": "vol-1"}},
	}}
	id, err := vs.GetVolumeID(pv)
	if c.noError("VolumeSnapshotter GetVolumeID", err) {
		c.equal("VolumeSnapshotter GetVolumeID", id, "vol-1")
	}
	updated, err := vs.SetVolumeID(pv, "vol-2")
	if c.noError("VolumeSnapshotter SetVolumeID", err) {
		handle, _, _ := unstructured.NestedString(updated.UnstructuredContent(), "spec", "csi", "volumeHandle")
		c.equal("VolumeSnapshotter SetVolumeID", handle, "vol-2")
	}
	c.noError("VolumeSnapshotter DeleteSnapshot", vs.DeleteSnapshot("snap-vol-1"))
}

// runFerry calls Ferry's data mover plugin as Velero's backup does; see the package comment.
func runFerry() int {
	flags := pflag.NewFlagSet("ferry", pflag.ContinueOnError)
	pluginDir := flags.String("plugin-dir", "", "directory holding the plugin binaries")
	pvcFile := flags.String("pvc", "", "JSON of the PVC to back up")
	backupFile := flags.String("backup", "", "JSON of the Backup")
	wait := flags.Duration("wait", 3*time.Minute, "how long the operation may take")
	flags.String("log-level", "info", "passed on to plugins")
	flags.String("features", "", "passed on to plugins")
	flags.ParseErrorsAllowlist.UnknownFlags = true
	if err := flags.Parse(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", what, err)
		return 1
	}
	pvc := &unstructured.Unstructured{}
	backup := &velerov1.Backup{}
	for file, into := range map[string]any{*pvcFile: &pvc.Object, *backupFile: backup} {
		bytes, err := os.ReadFile(file)
		if err != nil {
			return fail("reading "+file, err)
		}
		if err := json.Unmarshal(bytes, into); err != nil {
			return fail("parsing "+file, err)
		}
	}

	logger := logrus.New()
	logger.Out = os.Stderr
	logger.Level = logrus.DebugLevel
	registry := process.NewRegistry(*pluginDir, logger, logger.Level)
	if err := registry.DiscoverPlugins(); err != nil {
		return fail("registry.DiscoverPlugins", err)
	}
	result := map[string]any{}
	plugins := map[string][]string{}
	for _, kind := range common.AllPluginKinds() {
		for _, id := range registry.List(kind) {
			plugins[string(kind)] = append(plugins[string(kind)], id.Name)
		}
		sort.Strings(plugins[string(kind)])
	}
	result["plugins"] = plugins

	manager := clientmgmt.NewManager(logger, logger.Level, registry)
	defer manager.CleanupClients()
	bia, err := manager.GetBackupItemActionV2("ferry.io/pvc-backup")
	if err != nil {
		return fail("GetBackupItemActionV2(ferry.io/pvc-backup)", err)
	}
	selector, err := bia.AppliesTo()
	if err != nil {
		return fail("AppliesTo", err)
	}
	result["appliesTo"] = selector.IncludedResources
	item, _, operationID, postOperationItems, err := bia.Execute(pvc, backup)
	if err != nil {
		return fail("Execute", err)
	}
	result["annotations"] = item.(*unstructured.Unstructured).GetAnnotations()
	result["operationID"] = operationID
	result["postOperationItems"] = postOperationItems
	deadline := time.Now().Add(*wait)
	polls := 0
	var progress velero.OperationProgress
	for {
		polls++
		progress, err = bia.Progress(operationID, backup)
		if err != nil {
			return fail("Progress", err)
		}
		if progress.Completed || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	result["progress"] = progress
	result["polls"] = polls
	if _, err := bia.Progress("no-such-operation", backup); err != nil {
		result["unknownOperationError"] = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		return fail("writing the result", err)
	}
	return 0
}
