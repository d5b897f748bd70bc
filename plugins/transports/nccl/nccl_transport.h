// The `nccl` transport: payload objects are broadcast over NCCL from the sender (rank 0) to every
// receiver, everything else (manifests, commits, acks, need-full requests) is a file in a shared
// control directory through the disk transport's engine.
//
// Sender: Create publishes a session (a fresh ncclUniqueId) in <control_dir>/session, waits for
// `receivers` receivers to join and forms the communicator. A payload put broadcasts a header
// (key, length), then the bytes, bucket_bytes at a time, double-buffered (nccl_pipe.h), then
// waits for every receiver's answer (kept / no room), so a put that returned is readable on every
// receiver. The sender keeps no payload bytes: it lists and sizes what it broadcast, but cannot
// read it back.
// Destroying it ends the session (a shutdown header), so the next instance starts a new one.
//
// Receiver: Create starts a thread that joins each session it sees and writes the broadcast
// payloads into a host inbox of at most inbox_bytes (older versions are evicted first), from
// which get/size/list answer; until GPU decode kernels exist, receivers decode from this copy.
//
// Thread safety: every method may be called from several threads; broadcasts are serialized.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/disk_transport.h"
#include "nccl_pipe.h"
#include "nccl_session.h"
#include "refit/sdk/plugin.hpp"
#include "refit/status.h"

namespace refit::nccl {

struct NcclOptions {
  std::string control_dir;
  bool fsync = true;
  int receivers = 1;
  uint64_t bucket_bytes = uint64_t{64} << 20;
  int device = -1;  // -1: rank % visible devices
  uint64_t inbox_bytes = uint64_t{8} << 30;
  double connect_timeout_s = 120;
  double op_timeout_s = 300;
};

class NcclTransport {
 public:
  static Result<std::unique_ptr<NcclTransport>> Create(const sdk::ConfigView& cfg,
                                                       refit_transport_role_t role,
                                                       const std::string& peer_id);
  ~NcclTransport();

  Status Put(const std::string& key, const uint8_t* data, uint64_t len);
  Result<std::optional<uint64_t>> Size(const std::string& key);
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix);
  Status Remove(const std::string& key);

  // True for the keys that travel over NCCL: "v<8 digits>/payload.*" (docs/wire-format.md).
  static bool IsPayloadKey(const std::string& key);

 private:
  NcclTransport(NcclOptions options, refit_transport_role_t role, std::string peer,
                const Runtime& rt)
      : options_(std::move(options)), role_(role), peer_(std::move(peer)), rt_(rt) {}
  Status OpenControl();
  Status StartSender();
  Status Broadcast(uint32_t op, const std::string& key, const uint8_t* data, uint64_t len);
  void ReceiverLoop();
  Status FollowSession(const Session& session);
  Status ReceiveObjects(NcclPipe& pipe);
  Result<bool> ReceivePut(NcclPipe& pipe, const std::string& key, uint64_t len,
                          const WaitPolicy& busy);
  void EvictFor(const std::string& key, uint64_t len);
  // WaitPolicy::abandon while idle between objects: true once another session replaced ours.
  static bool SessionReplaced(void* self);
  int DeviceFor(int rank) const;

  NcclOptions options_;
  refit_transport_role_t role_;
  std::string peer_;
  const Runtime& rt_;
  std::unique_ptr<disk::DiskTransport> objects_;  // <control_dir>/objects: the protocol's keys
  std::unique_ptr<disk::DiskTransport> session_;  // <control_dir>/nccl: session, joins, ranks

  // Sender.
  std::mutex send_mutex_;  // one broadcast at a time
  std::unique_ptr<NcclPipe> pipe_;
  std::map<std::string, uint64_t> sent_;  // payload keys broadcast (sizes only), under mutex_

  // Receiver.
  std::mutex mutex_;
  std::map<std::string, std::vector<uint8_t>> inbox_;
  uint64_t inbox_used_ = 0;
  std::map<std::string, std::string> dropped_;  // payloads not kept, and why
  std::string last_error_;                      // why the last session ended badly
  std::string session_nonce_;                   // the session being followed
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace refit::nccl
