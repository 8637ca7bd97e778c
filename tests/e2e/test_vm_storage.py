"""End-to-end tests of StorageService volumes seen from inside a real guest (label vm).

A virt://qemu:///system node (vmtest.py: the test guest, TCG) that also holds a DIR pool. One
guest at a time, 192 MiB.

  test_snapshot_restore_from_inside_the_guest
      a qcow2 volume attached to a VM (CreateWorkload's storage volumes: /dev/vdb in the guest,
      IN_USE) gets marker A from inside the guest (dd + fsync through ExecuteWorkload); while
      the domain runs, CreateSnapshot and CloneVolume are refused FAILED_PRECONDITION naming
      the workload; the VM stops; CreateSnapshot; the VM starts (marker A still there), writes
      marker B; RestoreSnapshot while it runs fails FAILED_PRECONDITION naming the workload;
      the VM stops; RestoreSnapshot; a clone of the stopped VM's volume holds A; the VM starts
      and reads marker A, not B; RemoveWorkload leaves the volume READY.
"""
import os
import subprocess
import tempfile

import grpc

import pvtest
import vmtest
from vmtest import Base
from pivirt.storage.v1 import storage_pb2 as S, storage_pb2_grpc
from pivirt.operations.v1 import operations_pb2 as O, operations_pb2_grpc

POD = "vsp"
NODE = "vsq1"
MIB = 1 << 20


setUpModule, tearDownModule = vmtest.fixtures(POD, NODE, "vst", storage=True)


class VolumeInGuest(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.st = storage_pb2_grpc.StorageServiceStub(cls.stack.channel(0))
        cls.ops = operations_pb2_grpc.OperationServiceStub(cls.stack.channel(0))

    def write_marker(self, wid, text):
        out, code = self.execute(wid, ["/bin/sh", "-c", "echo %s | dd of=/dev/vdb bs=512 "
                                       "conv=fsync 2>/dev/null && sync" % text])
        self.assertEqual((out, code), ("", "[exitcode] 0"))

    def read_marker(self, wid):
        out, code = self.execute(wid, ["/bin/sh", "-c",
                                       "dd if=/dev/vdb bs=512 count=1 2>/dev/null | head -n 1"])
        self.assertEqual(code, "[exitcode] 0")
        return out.strip()

    def refused(self, fn, req, wid):
        with self.assertRaises(grpc.RpcError) as e:
            fn(req, timeout=60)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION,
                         e.exception.details())
        self.assertIn(wid, e.exception.details())
        self.assertIn("running", e.exception.details())

    def restore(self, snap):
        op = self.st.RestoreSnapshot(S.RestoreSnapshotRequest(snapshot_id=snap.id), timeout=10)
        return self.ops.WaitOperation(O.WaitOperationRequest(id=op.id, timeout_seconds=60),
                                      timeout=65)

    def start_again(self, wid):
        self.control(wid, "start")
        self.wait_agent(wid)

    def test_snapshot_restore_from_inside_the_guest(self):
        pool_dir = os.path.join(self.stack.data_dir, "pools", "vspool")
        p = self.st.CreatePool(S.CreatePoolRequest(
            name="vspool", type=S.POOL_TYPE_DIR, config={"path": pool_dir, "node": NODE}),
            timeout=60)
        self.assertEqual(p.status, S.POOL_STATUS_ACTIVE)
        vol = self.st.CreateVolume(S.CreateVolumeRequest(
            name="data", pool="vspool", size_bytes=64 * MIB, format=S.VOLUME_FORMAT_QCOW2),
            timeout=60)
        opts = vmtest.deploy("vstdisk")
        opts.resources["storage"] = b'{"volumes": ["data:vdb"]}'
        msg, _ = self.create("vstdisk", opts=opts)
        wid = msg.id
        self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=vol.id), timeout=10).status,
                         S.VOLUME_STATUS_IN_USE)
        self.wait_agent(wid)
        self.write_marker(wid, "MARKER-A")
        self.assertEqual(self.read_marker(wid), "MARKER-A")
        # a running domain holds the image open: no snapshot, no clone of it
        self.refused(self.st.CreateSnapshot, S.CreateSnapshotRequest(volume_id=vol.id,
                                                                     name="early"), wid)
        self.refused(self.st.CloneVolume, S.CloneVolumeRequest(source_id=vol.id, name="torn"),
                     wid)
        self.control(wid, "stop")
        s1 = self.st.CreateSnapshot(S.CreateSnapshotRequest(volume_id=vol.id, name="s1"),
                                    timeout=60)
        self.assertEqual(s1.status, S.SNAPSHOT_STATUS_READY)
        self.start_again(wid)
        self.assertEqual(self.read_marker(wid), "MARKER-A")
        self.write_marker(wid, "MARKER-B")
        self.assertEqual(self.read_marker(wid), "MARKER-B")
        done = self.restore(s1)
        self.assertEqual(done.status, O.OPERATION_STATUS_FAILED, done)
        self.assertEqual(done.error.code, grpc.StatusCode.FAILED_PRECONDITION.value[0], done)
        self.assertIn(wid, done.error.message)
        self.control(wid, "stop")
        done = self.restore(s1)
        self.assertEqual(done.status, O.OPERATION_STATUS_SUCCEEDED, done)
        # the stopped VM's disk can be cloned: the clone holds what the snapshot held
        clone = self.st.CloneVolume(S.CloneVolumeRequest(source_id=vol.id, name="copy"),
                                    timeout=60)
        with tempfile.TemporaryDirectory() as d:
            raw = os.path.join(d, "copy.raw")
            subprocess.run(["qemu-img", "convert", "-U", "-O", "raw",
                            os.path.join(pool_dir, "copy"), raw], check=True)
            with open(raw, "rb") as f:
                self.assertEqual(f.read(9), b"MARKER-A\n")
        self.st.DeleteVolume(S.DeleteVolumeRequest(id=clone.id), timeout=30)
        self.start_again(wid)
        self.assertEqual(self.read_marker(wid), "MARKER-A")
        self.remove(wid)
        self.assertEqual(self.st.GetVolume(S.GetVolumeRequest(id=vol.id), timeout=10).status,
                         S.VOLUME_STATUS_READY)
        self.assertEqual(vmtest.domains("vst"), [])


if __name__ == "__main__":
    pvtest.main()
