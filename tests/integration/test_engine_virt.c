/*
 * The virt engine against libvirt's in-process test driver (test:///default): lifecycle through
 * wk_engine.h (create, start, pause, resume, stop, remove) with the states libvirt reports, the
 * domain XML built from the spec (memory, vcpus, cpuset, disks, network), workloads found again
 * through their metadata only (a second engine, the driver's own "test" domain ignored), the
 * errors of each call, wk_engine_virt.h's networks and raw operations, and client text holding
 * markup and entity look-alikes read back unchanged from the XML. Every connection to
 * test:///default in a process shares one state, which already holds a domain "test" and a
 * network "default": names here are unique per run, and what is checked is read back from
 * libvirt through a connection of the test's own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>

#include "wk_engine.h"
#include "wk_engine_virt.h"

#define URI "test:///default"

typedef struct fixture {
    wk_engine *e;
    wk_virt *v;
    virConnectPtr conn; /* the test's own view of the driver */
    char dir[64];       /* disk images */
    char net[32];       /* a second network, defined by the test */
} fixture;

static int seq;

static void quiet(void *u, virErrorPtr err) {
    (void)u, (void)err;
}

/* A unique id (also the name's suffix) per call. */
static void uniq(char *buf, size_t n, const char *what) {
    snprintf(buf, n, "%s-%d-%d", what, (int)getpid(), ++seq);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    *state = f;
    pv_status st;
    wk_engine_opts opts = {.stop_grace_seconds = 2};
    if (!f || wk_engine_open("virt://" URI, &opts, &f->e, &st) != PV_OK) {
        fprintf(stderr, "open: %s\n", f ? st.msg : "oom");
        return -1;
    }
    if (wk_virt_open(URI, &opts, &f->v, &st) != PV_OK) return -1;
    virSetErrorFunc(NULL, quiet);
    if (!(f->conn = virConnectOpen(URI))) return -1;
    int k = snprintf(f->dir, sizeof f->dir, "/tmp/pv-virt-test-");
    memset(f->dir + k, 'X', 6); /* mkdtemp's template */
    f->dir[k + 6] = '\0';
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->net, sizeof f->net, "pvnet%d", (int)getpid());
    char xml[512];
    snprintf(xml, sizeof xml,
             "<network><name>%s</name><bridge name='pvbr%d'/>"
             "<ip address='10.77.3.1' netmask='255.255.255.0'><dhcp>"
             "<range start='10.77.3.10' end='10.77.3.200'/></dhcp></ip></network>",
             f->net, (int)getpid() % 10000);
    virNetworkPtr n = virNetworkDefineXML(f->conn, xml);
    if (!n || virNetworkCreate(n) < 0) return -1;
    virNetworkFree(n);
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    wk_engine_close(f->e);
    wk_virt_close(f->v);
    if (f->conn) {
        virNetworkPtr n = virNetworkLookupByName(f->conn, f->net);
        if (n) {
            virNetworkDestroy(n);
            virNetworkUndefine(n);
            virNetworkFree(n);
        }
        virConnectClose(f->conn);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (f->dir[0] && system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", f->dir);
    free(f);
    return 0;
}

/* A spec with id and name "<id>_vm", no resources. */
static wk_workload_spec spec_of(const char *id, char *name, size_t n) {
    snprintf(name, n, "%s_vm", id);
    return (wk_workload_spec){.id = id,
                              .name = name,
                              .image = "hub/ns/app:1",
                              .labels_json = "{\"ERU\":\"1\",\"app\":\"web\"}"};
}

static void create_ok(fixture *f, const wk_workload_spec *s, wk_engine_info *info) {
    pv_status st;
    if (wk_engine_create(f->e, s, info, &st) != PV_OK) fail_msg("create %s: %s", s->id, st.msg);
}

static wk_state state_of(fixture *f, const char *id) {
    pv_status st;
    wk_engine_info info;
    if (wk_engine_inspect(f->e, id, &info, &st) != PV_OK) fail_msg("inspect %s: %s", id, st.msg);
    wk_state s = info.state;
    wk_engine_info_clear(&info);
    return s;
}

static int vir_state(fixture *f, const char *name) {
    virDomainPtr d = virDomainLookupByName(f->conn, name);
    if (!d) return -1;
    int s = -1, reason;
    virDomainGetState(d, &s, &reason, 0);
    virDomainFree(d);
    return s;
}

/* The domain's XML as the test's own connection sees it (caller frees). */
static char *xml_of(fixture *f, const char *name, unsigned int flags) {
    virDomainPtr d = virDomainLookupByName(f->conn, name);
    assert_non_null(d);
    char *xml = virDomainGetXMLDesc(d, flags);
    virDomainFree(d);
    assert_non_null(xml);
    return xml;
}

static void remove_ok(fixture *f, const char *id) {
    pv_status st;
    if (wk_engine_remove(f->e, id, true, &st) != PV_OK) fail_msg("remove %s: %s", id, st.msg);
}

static void test_lifecycle(void **state) {
    fixture *f = *state;
    char id[64], name[80];
    uniq(id, sizeof id, "life");
    wk_workload_spec s = spec_of(id, name, sizeof name);
    wk_engine_info info;
    pv_status st;
    assert_string_equal(wk_engine_type(f->e), "virt");

    create_ok(f, &s, &info);
    assert_int_equal(info.state, WK_STATE_CREATED);
    assert_string_equal(info.id, id);
    assert_string_equal(info.name, name);
    assert_string_equal(info.image, "hub/ns/app:1");
    assert_int_equal(strlen(info.engine_id), 36); /* the domain's UUID */
    virDomainPtr d = virDomainLookupByUUIDString(f->conn, info.engine_id);
    assert_non_null(d);
    assert_string_equal(virDomainGetName(d), name);
    assert_int_equal(virDomainIsPersistent(d), 1);
    virDomainFree(d);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_SHUTOFF);
    wk_engine_info_clear(&info);

    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING);
    assert_int_equal(state_of(f, id), WK_STATE_RUNNING);
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "already running"));

    assert_int_equal(wk_engine_pause(f->e, id, &st), PV_OK);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_PAUSED);
    assert_int_equal(state_of(f, id), WK_STATE_PAUSED);
    assert_int_equal(wk_engine_pause(f->e, id, &st), PV_FAILED_PRECONDITION);
    assert_int_equal(wk_engine_resume(f->e, id, &st), PV_OK);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING);
    assert_int_equal(wk_engine_resume(f->e, id, &st), PV_FAILED_PRECONDITION);

    assert_int_equal(wk_engine_stop(f->e, id, -1, false, &st), PV_OK);
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_SHUTOFF);
    assert_int_equal(wk_engine_inspect(f->e, id, &info, &st), PV_OK);
    assert_int_equal(info.state, WK_STATE_STOPPED); /* shut off after a start: not CREATED */
    assert_int_equal(info.exit_code, 0);            /* a clean shutdown */
    assert_true(info.started_ms > 0);
    assert_true(info.finished_ms >= info.started_ms);
    wk_engine_info_clear(&info);
    assert_int_equal(wk_engine_stop(f->e, id, -1, false, &st), PV_FAILED_PRECONDITION);

    /* force: destroyed at once, which reads as a kill */
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_int_equal(wk_engine_stop(f->e, id, 30, true, &st), PV_OK);
    assert_int_equal(wk_engine_inspect(f->e, id, &info, &st), PV_OK);
    assert_int_equal(info.state, WK_STATE_STOPPED);
    assert_int_equal(info.exit_code, 137);
    wk_engine_info_clear(&info);

    /* remove: refused while running, forced destroys and undefines */
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_int_equal(wk_engine_remove(f->e, id, false, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, id));
    assert_int_equal(vir_state(f, name), VIR_DOMAIN_RUNNING);
    assert_int_equal(wk_engine_remove(f->e, id, true, &st), PV_OK);
    assert_int_equal(vir_state(f, name), -1);
    assert_int_equal(wk_engine_inspect(f->e, id, &info, &st), PV_NOT_FOUND);

    /* a stopped one goes without force */
    uniq(id, sizeof id, "life");
    s = spec_of(id, name, sizeof name);
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);
    assert_int_equal(wk_engine_remove(f->e, id, false, &st), PV_OK);
    assert_int_equal(vir_state(f, name), -1);
}

static void test_domain_from_spec(void **state) {
    fixture *f = *state;
    char id[64], name[80], a[128], b[128];
    uniq(id, sizeof id, "spec");
    snprintf(a, sizeof a, "%s/a.img", f->dir);
    snprintf(b, sizeof b, "%s/b.qcow2", f->dir);
    FILE *fa = fopen(a, "w"), *fb = fopen(b, "w");
    assert_non_null(fa);
    assert_non_null(fb);
    fputs("raw bytes", fa);
    fwrite("QFI\xfb\0\0\0\3", 1, 8, fb);
    fclose(fa);
    fclose(fb);
    const char *vols[] = {a, b};
    const int cpus[] = {0, 1};
    wk_workload_spec s = spec_of(id, name, sizeof name);
    s.cpu_limit = 1.5;
    s.memory_limit = 256LL * 1024 * 1024;
    s.cpuset = cpus;
    s.ncpuset = 2;
    s.volumes = vols;
    s.nvolumes = 2;
    wk_engine_info info;
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);

    char *xml = xml_of(f, name, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(xml, "<memory unit='KiB'>262144</memory>"));
    assert_non_null(strstr(xml, "cpuset='0-1'>2</vcpu>")); /* ceil(1.5), libvirt's range form */
    char want[256];
    snprintf(want, sizeof want, "<source file='%s'/>\n      <target dev='vda' bus='virtio'/>", a);
    assert_non_null(strstr(xml, want));
    snprintf(want, sizeof want, "<source file='%s'/>\n      <target dev='vdb' bus='virtio'/>", b);
    assert_non_null(strstr(xml, want));
    assert_non_null(strstr(xml, "<driver name='qemu' type='qcow2'/>"));
    assert_non_null(strstr(xml, "<driver name='qemu' type='raw'/>"));
    assert_non_null(strstr(xml, "<source network='default'/>")); /* "default" exists */
    assert_non_null(strstr(xml, WK_VIRT_XMLNS));
    free(xml);
    remove_ok(f, id);

    /* no resources: 1 vcpu, 512 MiB, no disk */
    uniq(id, sizeof id, "spec");
    s = spec_of(id, name, sizeof name);
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);
    xml = xml_of(f, name, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(xml, "<memory unit='KiB'>524288</memory>"));
    assert_non_null(strstr(xml, "<vcpu placement='static'>1</vcpu>"));
    assert_null(strstr(xml, "<disk"));
    free(xml);
    remove_ok(f, id);
}

static bool list_has(wk_engine_info *infos, size_t n, const char *id, wk_engine_info **hit) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(infos[i].id, id) == 0) {
            *hit = &infos[i];
            return true;
        }
    return false;
}

static void test_list_and_metadata(void **state) {
    fixture *f = *state;
    char id1[64], id2[64], n1[80], n2[80];
    uniq(id1, sizeof id1, "list");
    uniq(id2, sizeof id2, "list");
    wk_workload_spec s1 = spec_of(id1, n1, sizeof n1), s2 = spec_of(id2, n2, sizeof n2);
    wk_engine_info info;
    pv_status st;
    create_ok(f, &s1, &info);
    wk_engine_info_clear(&info);
    create_ok(f, &s2, &info);
    wk_engine_info_clear(&info);
    assert_int_equal(wk_engine_start(f->e, id2, &st), PV_OK);

    /* a second engine (an agent that restarted) finds them from libvirt alone */
    wk_engine *e2;
    assert_int_equal(wk_engine_open("virt://" URI, NULL, &e2, &st), PV_OK);
    wk_engine_info *infos = NULL;
    size_t n = 0;
    assert_int_equal(wk_engine_list(e2, &infos, &n, &st), PV_OK);
    wk_engine_info *a = NULL, *b = NULL;
    assert_true(list_has(infos, n, id1, &a));
    assert_true(list_has(infos, n, id2, &b));
    assert_int_equal(a->state, WK_STATE_CREATED);
    assert_int_equal(b->state, WK_STATE_RUNNING);
    assert_string_equal(a->name, n1);
    assert_string_equal(a->image, "hub/ns/app:1");
    json_t *labels = json_loads(a->labels_json, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(labels, "app")), "web");
    assert_string_equal(json_string_value(json_object_get(labels, "ERU")), "1");
    json_decref(labels);
    for (size_t i = 0; i < n; i++)
        assert_string_not_equal(infos[i].name, "test"); /* the driver's own domain */
    wk_engine_info_array_free(infos, n);

    /* the running one reports its interface on "default": MAC and the driver's address */
    assert_int_equal(wk_engine_inspect(e2, id2, &info, &st), PV_OK);
    json_t *nets = json_loads(info.networks_json, 0, NULL);
    json_t *def = json_object_get(nets, "default");
    assert_non_null(def);
    assert_int_equal(strncmp(json_string_value(json_object_get(def, "mac")), "52:54:00:", 9), 0);
    assert_true(json_array_size(json_object_get(def, "addresses")) >= 1);
    json_decref(nets);
    assert_string_equal(info.publish_json, "{}");
    wk_engine_info_clear(&info);
    assert_int_equal(wk_engine_inspect(e2, "test", &info, &st), PV_NOT_FOUND);
    wk_engine_close(e2);

    remove_ok(f, id1);
    remove_ok(f, id2);
}

static void test_errors(void **state) {
    fixture *f = *state;
    char id[64], name[80], other[64], oname[80];
    uniq(id, sizeof id, "err");
    wk_workload_spec s = spec_of(id, name, sizeof name);
    wk_engine_info info;
    pv_status st;
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);

    assert_int_equal(wk_engine_create(f->e, &s, &info, &st), PV_ALREADY_EXISTS);
    assert_non_null(strstr(st.msg, id));
    uniq(other, sizeof other, "err");
    wk_workload_spec same_name = spec_of(other, oname, sizeof oname);
    same_name.name = name;
    assert_int_equal(wk_engine_create(f->e, &same_name, &info, &st), PV_ALREADY_EXISTS);
    assert_non_null(strstr(st.msg, name));

    const char *unknown = "no-such-workload";
    assert_int_equal(wk_engine_inspect(f->e, unknown, &info, &st), PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, unknown));
    assert_int_equal(wk_engine_start(f->e, unknown, &st), PV_NOT_FOUND);
    assert_int_equal(wk_engine_stop(f->e, unknown, 1, false, &st), PV_NOT_FOUND);
    assert_int_equal(wk_engine_pause(f->e, unknown, &st), PV_NOT_FOUND);
    assert_int_equal(wk_engine_remove(f->e, unknown, true, &st), PV_NOT_FOUND);

    const char *argv[] = {"true"};
    int code = 0;
    char *out = (char *)"x";
    size_t len = 1;
    assert_int_equal(wk_engine_exec(f->e, id, argv, 1, 1000, &code, &out, &len, &st),
                     PV_UNIMPLEMENTED);
    assert_non_null(strstr(st.msg, "guest agent"));
    assert_null(out);

    const char *sysctls[] = {"net.ipv4.ip_forward=1"};
    uniq(other, sizeof other, "err");
    wk_workload_spec bad = spec_of(other, oname, sizeof oname);
    bad.sysctls = sysctls;
    bad.nsysctls = 1;
    assert_int_equal(wk_engine_create(f->e, &bad, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "sysctls"));
    bad = spec_of("bad/id", oname, sizeof oname);
    assert_int_equal(wk_engine_create(f->e, &bad, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "id"));
    bad = spec_of(other, oname, sizeof oname);
    bad.labels_json = "[1]";
    assert_int_equal(wk_engine_create(f->e, &bad, &info, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "labels_json"));
    assert_int_equal(vir_state(f, oname), -1); /* nothing defined by the refused creates */

    wk_engine *e2 = NULL;
    assert_int_equal(wk_engine_open("virt://nosuchdriver:///x", NULL, &e2, &st), PV_UNAVAILABLE);
    assert_non_null(strstr(st.msg, "nosuchdriver"));
    assert_null(e2);
    remove_ok(f, id);
}

static void test_list_networks(void **state) {
    fixture *f = *state;
    wk_virt_network *nets = NULL;
    size_t n = 0;
    pv_status st;
    assert_int_equal(wk_virt_list_networks(f->v, &nets, &n, &st), PV_OK);
    bool def = false, ours = false;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(nets[i].name, "default") == 0) {
            def = true;
            assert_true(nets[i].active);
            assert_string_equal(nets[i].bridge, "virbr0");
            assert_int_equal(nets[i].nsubnets, 1);
            assert_string_equal(nets[i].subnets[0], "192.168.122.0/24");
        } else if (strcmp(nets[i].name, f->net) == 0) {
            ours = true;
            assert_int_equal(nets[i].nsubnets, 1);
            assert_string_equal(nets[i].subnets[0], "10.77.3.0/24");
        }
    }
    assert_true(def);
    assert_true(ours);
    wk_virt_network_array_free(nets, n);
}

static bool has_iface(fixture *f, const char *name, unsigned int flags, const char *mac,
                      const char *net) {
    char *xml = xml_of(f, name, flags);
    char want[128];
    snprintf(want, sizeof want, "<mac address='%s'/>\n      <source network='%s'/>", mac, net);
    bool hit = strstr(xml, want) != NULL;
    free(xml);
    return hit;
}

/* Whether the test network (f->net) has a DHCP host entry of mac for ipv4. */
static bool has_dhcp_host(fixture *f, const char *mac, const char *ipv4) {
    virNetworkPtr net = virNetworkLookupByName(f->conn, f->net);
    assert_non_null(net);
    char *nxml = virNetworkGetXMLDesc(net, 0), want[128];
    virNetworkFree(net);
    assert_non_null(nxml);
    snprintf(want, sizeof want, "<host mac='%s' ip='%s'/>", mac, ipv4);
    bool hit = strstr(nxml, want) != NULL;
    free(nxml);
    return hit;
}

static void test_connect_disconnect(void **state) {
    fixture *f = *state;
    char id[64], name[80];
    uniq(id, sizeof id, "net");
    wk_workload_spec s = spec_of(id, name, sizeof name);
    wk_engine_info info;
    pv_status st;
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);
    wk_virt_link l;

    /* stopped: the persistent definition changes */
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, NULL, NULL, &l, &st), PV_OK);
    assert_false(l.live);
    assert_string_equal(l.network, f->net);
    assert_int_equal(l.nsubnets, 1);
    assert_string_equal(l.subnets[0], "10.77.3.0/24");
    assert_true(has_iface(f, name, VIR_DOMAIN_XML_INACTIVE, l.mac, f->net));
    assert_int_equal(wk_engine_inspect(f->e, id, &info, &st), PV_OK);
    json_t *nets = json_loads(info.networks_json, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(nets, f->net), "mac")),
                        l.mac);
    json_decref(nets);
    wk_engine_info_clear(&info);
    wk_virt_link_clear(&l);
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, NULL, NULL, &l, &st),
                     PV_ALREADY_EXISTS);
    assert_null(l.mac); /* nothing to free on an error */

    assert_int_equal(wk_virt_disconnect_network(f->v, id, f->net, false, &l, &st), PV_OK);
    assert_false(l.live);
    char mac[32];
    snprintf(mac, sizeof mac, "%s", l.mac);
    wk_virt_link_clear(&l);
    assert_false(has_iface(f, name, VIR_DOMAIN_XML_INACTIVE, mac, f->net));
    char *xml = xml_of(f, name, VIR_DOMAIN_XML_INACTIVE);
    assert_non_null(strstr(xml, "<source network='default'/>")); /* the other one stays */
    free(xml);
    assert_int_equal(wk_virt_disconnect_network(f->v, id, f->net, false, &l, &st), PV_NOT_FOUND);
    assert_int_equal(wk_virt_disconnect_network(f->v, id, f->net, true, &l, &st), PV_OK);
    assert_string_equal(l.mac, "");
    wk_virt_link_clear(&l);

    /* running, and the test driver cannot hot-plug: persistent only, live at the next start */
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, "10.77.3.50", NULL, &l, &st), PV_OK);
    assert_false(l.live);
    snprintf(mac, sizeof mac, "%s", l.mac);
    wk_virt_link_clear(&l);
    assert_true(has_iface(f, name, VIR_DOMAIN_XML_INACTIVE, mac, f->net));
    assert_false(has_iface(f, name, 0, mac, f->net));
    assert_true(has_dhcp_host(f, mac, "10.77.3.50"));
    assert_int_equal(wk_engine_stop(f->e, id, 1, false, &st), PV_OK);
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_true(has_iface(f, name, 0, mac, f->net));

    /* disconnect while running: off the definition now, off the domain at its next start */
    assert_int_equal(wk_virt_disconnect_network(f->v, id, f->net, false, &l, &st), PV_OK);
    assert_false(l.live);
    assert_string_equal(l.mac, mac);
    wk_virt_link_clear(&l);
    assert_false(has_iface(f, name, VIR_DOMAIN_XML_INACTIVE, mac, f->net));
    assert_true(has_iface(f, name, 0, mac, f->net));
    assert_false(has_dhcp_host(f, mac, "10.77.3.50")); /* the reservation went with it */
    assert_int_equal(wk_engine_stop(f->e, id, 0, false, &st), PV_OK);
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_false(has_iface(f, name, 0, mac, f->net));

    /* bad input */
    assert_int_equal(wk_virt_connect_network(f->v, id, "no-such-net", NULL, NULL, &l, &st),
                     PV_NOT_FOUND);
    assert_non_null(strstr(st.msg, "no-such-net"));
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, "not-an-ip", NULL, &l, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, NULL, "fd00::5", &l, &st),
                     PV_INVALID_ARGUMENT);
    assert_int_equal(wk_virt_connect_network(f->v, "no-such-workload", f->net, NULL, NULL, &l, &st),
                     PV_NOT_FOUND);
    remove_ok(f, id);
}

/* RemoveWorkload releases what ConnectNetwork's ipv4 reserved on the network's DHCP: of a
 * stopped domain, and of a running one removed with force. */
static void test_remove_releases_address(void **state) {
    fixture *f = *state;
    pv_status st;
    for (int running = 0; running < 2; running++) {
        char id[64], name[80], mac[32];
        uniq(id, sizeof id, "rel");
        wk_workload_spec s = spec_of(id, name, sizeof name);
        wk_engine_info info;
        create_ok(f, &s, &info);
        wk_engine_info_clear(&info);
        if (running) assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
        const char *ipv4 = running ? "10.77.3.61" : "10.77.3.60";
        wk_virt_link l;
        assert_int_equal(wk_virt_connect_network(f->v, id, f->net, ipv4, NULL, &l, &st), PV_OK);
        snprintf(mac, sizeof mac, "%s", l.mac);
        wk_virt_link_clear(&l);
        assert_true(has_dhcp_host(f, mac, ipv4));
        if (wk_engine_remove(f->e, id, running, &st) != PV_OK) fail_msg("remove: %s", st.msg);
        assert_int_equal(vir_state(f, name), -1);
        assert_false(has_dhcp_host(f, mac, ipv4));
    }
}

/* A domain paused by libvirt while its start is under way is running, not paused; the other
 * states as wk_engine.h has them. */
static void test_state_of(void **state) {
    (void)state;
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_STARTING_UP, true),
                     WK_STATE_RUNNING);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_PAUSED, VIR_DOMAIN_PAUSED_USER, true),
                     WK_STATE_PAUSED);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_PMSUSPENDED, 0, true), WK_STATE_PAUSED);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_RUNNING, VIR_DOMAIN_RUNNING_BOOTED, true),
                     WK_STATE_RUNNING);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_SHUTDOWN, 0, true), WK_STATE_RUNNING);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_SHUTOFF, VIR_DOMAIN_SHUTOFF_SHUTDOWN, true),
                     WK_STATE_STOPPED);
    assert_int_equal(wk_virt_state_of(VIR_DOMAIN_SHUTOFF, VIR_DOMAIN_SHUTOFF_UNKNOWN, false),
                     WK_STATE_CREATED);
}

/* Client text in the name, image and labels, markup and entity look-alikes included, comes back
 * as it was sent: through the metadata, and after the definition was rewritten (wk_xml's tree,
 * dumped) by a connect and a disconnect the test driver cannot hot-plug. A label may hold any
 * valid UTF-8, U+FFFF too, which XML 1.0 has no character for. */
static void test_hostile_metadata(void **state) {
    fixture *f = *state;
    char id[64], name[128];
    uniq(id, sizeof id, "hostile");
    snprintf(name, sizeof name, "<b a=\"x\">&amp;'%s]]>", id);
    static const char labels[] =
        "{\"m\":\"</workload><x>&lt;&#65;&foo;]]><![CDATA[c]]>\","
        "\"u\":\"\\u00e9\\u2603\\uffff\\ud83d\\ude00\",\"q\":\"\\\"'<!DOCTYPE w>\"}";
    wk_workload_spec s = {.id = id, .name = name, .image = "img&<>", .labels_json = labels};
    wk_engine_info info;
    pv_status st;
    create_ok(f, &s, &info);
    assert_string_equal(info.image, "img&<>");
    wk_engine_info_clear(&info);
    wk_virt_link l;
    assert_int_equal(wk_virt_connect_network(f->v, id, f->net, NULL, NULL, &l, &st), PV_OK);
    wk_virt_link_clear(&l);
    assert_int_equal(wk_virt_disconnect_network(f->v, id, f->net, false, &l, &st), PV_OK);
    wk_virt_link_clear(&l);

    wk_engine *e2;
    assert_int_equal(wk_engine_open("virt://" URI, NULL, &e2, &st), PV_OK);
    if (wk_engine_inspect(e2, id, &info, &st) != PV_OK) fail_msg("inspect: %s", st.msg);
    assert_string_equal(info.name, name);
    assert_string_equal(info.image, "img&<>");
    json_t *want = json_loads(labels, 0, NULL), *got = json_loads(info.labels_json, 0, NULL);
    assert_non_null(want);
    if (!json_equal(want, got)) fail_msg("labels came back as %s", info.labels_json);
    json_decref(want);
    json_decref(got);
    json_t *nets = json_loads(info.networks_json, 0, NULL);
    assert_non_null(json_object_get(nets, "default"));
    assert_null(json_object_get(nets, f->net));
    json_decref(nets);
    wk_engine_info_clear(&info);
    wk_engine_close(e2);
    remove_ok(f, id);
}

static void test_raw(void **state) {
    fixture *f = *state;
    char id[64], name[80];
    uniq(id, sizeof id, "raw");
    wk_workload_spec s = spec_of(id, name, sizeof name);
    s.cpu_limit = 2;
    s.memory_limit = 128LL * 1024 * 1024;
    wk_engine_info info;
    pv_status st;
    create_ok(f, &s, &info);
    wk_engine_info_clear(&info);
    char *out = NULL;

    assert_int_equal(wk_virt_raw(f->v, id, "domain_xml", NULL, &out, &st), PV_OK);
    char want[128];
    snprintf(want, sizeof want, "<name>%s</name>", name);
    assert_non_null(strstr(out, want));
    free(out);
    assert_int_equal(wk_virt_raw(f->v, id, "domain_xml", "{\"inactive\":true}", &out, &st), PV_OK);
    assert_non_null(strstr(out, want));
    free(out);

    assert_int_equal(wk_virt_raw(f->v, id, "dominfo", "{}", &out, &st), PV_OK);
    json_t *j = json_loads(out, 0, NULL);
    free(out);
    assert_string_equal(json_string_value(json_object_get(j, "state")), "shutoff");
    assert_int_equal(json_integer_value(json_object_get(j, "vcpus")), 2);
    assert_int_equal(json_integer_value(json_object_get(j, "max_memory_kib")), 131072);
    assert_string_equal(json_string_value(json_object_get(j, "name")), name);
    json_decref(j);

    /* reboot needs a running domain: libvirt says so, as FAILED_PRECONDITION */
    assert_int_equal(wk_virt_raw(f->v, id, "reboot", NULL, &out, &st), PV_FAILED_PRECONDITION);
    assert_non_null(strstr(st.msg, "not running"));
    assert_int_equal(wk_engine_start(f->e, id, &st), PV_OK);
    assert_int_equal(wk_virt_raw(f->v, id, "reboot", NULL, &out, &st), PV_OK);
    assert_string_equal(out, "{\"done\":true,\"op\":\"reboot\"}");
    free(out);
    assert_int_equal(wk_virt_raw(f->v, id, "reset", NULL, &out, &st), PV_OK);
    free(out);
    assert_int_equal(wk_virt_raw(f->v, id, "dominfo", NULL, &out, &st), PV_OK);
    assert_non_null(strstr(out, "\"state\":\"running\""));
    free(out);

    assert_int_equal(wk_virt_raw(f->v, id, "format_disk", NULL, &out, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "format_disk"));
    assert_null(out);
    assert_int_equal(wk_virt_raw(f->v, id, "dominfo", "[1,2]", &out, &st), PV_INVALID_ARGUMENT);
    assert_non_null(strstr(st.msg, "params"));
    assert_int_equal(wk_virt_raw(f->v, "no-such-workload", "dominfo", NULL, &out, &st),
                     PV_NOT_FOUND);
    remove_ok(f, id);
}

typedef struct worker {
    fixture *f;
    char id[64], name[80];
    int failures;
    pv_status st;
} worker;

/* One workload's whole life, as the agent's threads would drive it at the same time. */
static void *run_worker(void *arg) {
    worker *w = arg;
    wk_workload_spec s = spec_of(w->id, w->name, sizeof w->name);
    wk_engine_info info;
    for (int round = 0; round < 5; round++) {
        int ok = wk_engine_create(w->f->e, &s, &info, &w->st) == PV_OK;
        if (ok) wk_engine_info_clear(&info);
        ok = ok && wk_engine_start(w->f->e, w->id, &w->st) == PV_OK;
        ok = ok && wk_engine_stop(w->f->e, w->id, 1, false, &w->st) == PV_OK;
        ok = ok && wk_engine_remove(w->f->e, w->id, false, &w->st) == PV_OK;
        if (!ok) w->failures++;
    }
    return NULL;
}

static void test_threads(void **state) {
    fixture *f = *state;
    enum { N = 4 };
    worker w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].f = f;
        uniq(w[i].id, sizeof w[i].id, "thr");
        assert_int_equal(pthread_create(&t[i], NULL, run_worker, &w[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        if (w[i].failures)
            fail_msg("%s: %d failures, last: %s", w[i].id, w[i].failures, w[i].st.msg);
        assert_int_equal(vir_state(f, w[i].name), -1);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),         cmocka_unit_test(test_domain_from_spec),
        cmocka_unit_test(test_list_and_metadata), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_list_networks),     cmocka_unit_test(test_connect_disconnect),
        cmocka_unit_test(test_hostile_metadata),  cmocka_unit_test(test_raw),
        cmocka_unit_test(test_threads),           cmocka_unit_test(test_remove_releases_address),
        cmocka_unit_test(test_state_of),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
