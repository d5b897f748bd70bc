// The `ucx` transport: the keyed blob channel as a push channel over UCX active messages.
//
// The sender instance (role 0) listens and is the source of truth: every object lives in its
// spool directory (the disk transport's engine), and a put writes the spool, then pushes the
// object to every connected receiver. A receiver (role 1) connects, says who it is and which
// objects it already holds, gets the rest replayed from the spool, and then keeps what is pushed
// in a bounded in-memory inbox that serves its reads. A read the inbox cannot serve (evicted, a
// payload already read to its end, a push still on the way) and every list are asked of the
// sender; a receiver's put and remove (acks, need-full requests) are stored in the sender's spool.
// With no sender (between two `refit send` processes) a receiver answers sizes and lists from its
// inbox (once a sender replayed it: before that it knows nothing, and says so), a read it cannot
// serve waits for the next sender (up to request_timeout), and it queues its puts until it
// reconnects.
//
// Threads: each instance has a progress thread and a dispatch thread (ucx_worker.h); a receiver
// also has a connector thread. Every public method may be called from several threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
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
#include "refit/plugin_abi.h"
#include "refit/sdk/plugin.hpp"
#include "refit/status.h"
#include "ucx_worker.h"

namespace refit::ucx {

struct UcxOptions {
  std::string listen;           // sender: "host:port" to listen on (port 0: any free port)
  std::string connect;          // receiver: "host:port" of the sender
  std::string rendezvous_file;  // sender writes its bound address here; receivers read it
  std::string tls = "tcp";      // UCX_TLS of this instance
  std::string spool_dir;        // sender: where its objects live
  bool spool_fsync = true;
  uint64_t max_inflight_bytes = uint64_t{256} << 20;
  uint64_t inbox_bytes = uint64_t{2} << 30;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds reconnect_max{1000};
  std::chrono::milliseconds send_timeout{30000};
  std::chrono::milliseconds request_timeout{30000};
};

class UcxTransport : public EventHandler {
 public:
  static Result<std::unique_ptr<UcxTransport>> Create(const sdk::ConfigView& cfg,
                                                      refit_transport_role_t role,
                                                      const std::string& peer_id);
  static Result<std::unique_ptr<UcxTransport>> Open(UcxOptions options, refit_transport_role_t role,
                                                    const std::string& peer_id);
  ~UcxTransport() override;

  Status Put(const std::string& key, const uint8_t* data, uint64_t len);
  Result<std::optional<uint64_t>> Size(const std::string& key);
  Status Get(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  Result<std::vector<std::pair<std::string, uint64_t>>> List(const std::string& prefix);
  Status Remove(const std::string& key);

  void OnEvent(Event event) override;

  // What a push completion needs (public for the completion functor in the .cc).
  void PushCompleted(uint64_t bytes);

 private:
  struct Pending;
  struct Entry {
    Bytes data;  // null once a payload was read to its end (size kept)
    uint64_t size = 0;
    uint64_t seq = 0;  // insertion order, for eviction
  };
  struct Peer {
    std::string id;
    bool ready = false;
    uint64_t pushed = 0;  // pushes posted to it (replies carry it: the receiver's read barrier)
  };
  UcxTransport(UcxOptions options, refit_transport_role_t role, std::string peer_id)
      : options_(std::move(options)), role_(role), peer_id_(std::move(peer_id)) {}
  bool sender() const { return role_ == REFIT_ROLE_SENDER; }
  Status StartSender();
  Status StartReceiver();

  // Sender.
  Status PushTo(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data);
  std::vector<ConnId> ReadyPeers();
  void OnHello(const Event& e);
  void Replay(ConnId conn, const std::string& inventory);
  void OnRequest(const Event& e);
  void Reply(ConnId conn, uint64_t id, const Status& st, uint64_t value, Bytes data);
  void OnPeerDown(const Event& e);
  void OnBye(const Event& e);
  Result<Bytes> ReadSpool(const std::string& key, uint64_t offset, uint64_t len);

  // Receiver.
  void ConnectLoop();
  Status ConnectOnce();
  std::string Inventory();
  void SayBye();
  Status FlushOutbox(ConnId conn);
  Result<std::shared_ptr<Pending>> Request(std::optional<ConnId> conn, MsgType type,
                                           const std::string& key, uint64_t a, uint64_t b,
                                           Bytes data);
  void OnPush(Event e);
  void OnReply(Event e);
  void StoreInInbox(const std::string& key, Bytes data);
  void WaitForPushes(uint64_t pushed);
  bool GetFromInbox(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len,
                    Status* st);
  Status GetThroughSender(const std::string& key, uint64_t offset, uint8_t* buf, uint64_t len);
  bool WaitForSender(std::chrono::steady_clock::time_point deadline);
  Status NotSynced(const std::string& key) const;

  UcxOptions options_;
  refit_transport_role_t role_;
  std::string peer_id_;
  std::string address_;  // sender: bound host:port; receiver: the sender's, once known

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // Sender.
  std::unique_ptr<disk::DiskTransport> spool_;
  std::map<ConnId, Peer> peers_;
  uint64_t inflight_ = 0;
  // Receiver.
  std::map<std::string, Entry> inbox_;
  uint64_t inbox_held_ = 0;
  uint64_t inbox_seq_ = 0;
  std::map<std::string, std::optional<Bytes>> outbox_;  // nullopt: a remove
  std::optional<ConnId> conn_;                          // the live connection to the sender
  bool synced_ = false;  // a sender replayed the inbox at least once (it then knows the spool)
  std::optional<ConnId> push_conn_;  // the connection whose pushes delivered_ counts
  uint64_t delivered_ = 0;
  std::atomic<uint64_t> remote_gets_{0};  // reads the inbox could not serve (a debug line at exit)
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  uint64_t next_request_ = 1;
  std::thread connector_;

  std::unique_ptr<Worker> worker_;  // last: destroyed first (its callbacks use the fields above)
};

}  // namespace refit::ucx
