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
// Relay fan-out (k > 0): every receiver also listens, and the sender places the receivers in a
// k-ary tree in join order (kTree tells each its children). A put is pushed to the sender's k
// children only; a receiver forwards each tree push to its children as soon as it is in its
// inbox. Requests, replies and replays stay on each receiver's own connection to the sender. A
// receiver dropped (timeout, disconnect, or reported by its parent relay) leaves the tree and the
// last leaf takes its place; what a re-placed receiver may have missed is read from the sender
// (the size reply says whether a key is still on its way down the tree to that receiver).
//
// Threads: each instance has a progress thread and a dispatch thread (ucx_worker.h); a receiver
// also has a connector thread. Every public method may be called from several threads at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
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
#include "ucx_pacer.h"
#include "ucx_push_ledger.h"
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
  uint64_t k = 0;                // relay fan-out; 0: the sender pushes to every receiver itself
  uint64_t await_receivers = 0;  // sender: receivers to wait for (connect_timeout) before a put
  uint64_t link_bandwidth = 0;   // bytes/s of each connection's data sends (emulated); 0: no cap
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
  // Until an object arrives (a receiver: a push into its inbox; the sender: a receiver's upload,
  // such as an ack) or timeout_ms pass; true when woken by one.
  Result<bool> Wait(uint32_t timeout_ms);

  void OnEvent(Event event) override;

  // What a push completion needs (public for the completion functor in the .cc).
  void PushCompleted(uint64_t bytes);

 private:
  struct Pending;
  struct Entry {
    Bytes data;  // null once a payload was read to its end (size kept)
    uint64_t size = 0;
    uint64_t seq = 0;       // insertion order, for eviction
    uint64_t tree_seq = 0;  // the put's push seq that brought it (0: a replay or its own put)
  };
  struct Peer {
    std::string id;
    bool ready = false;
    uint64_t pushed = 0;  // pushes posted to it (replies carry it: the receiver's read barrier)
    std::string relay_address;  // "host:port" it listens on for tree pushes; "": not relaying
    bool in_tree = false;
    uint64_t placed_at = 0;    // tree pushes up to this seq may not reach it (joined or re-placed)
    uint64_t ready_epoch = 0;  // ledger_.epoch() when it became ready
  };
  UcxTransport(UcxOptions options, refit_transport_role_t role, std::string peer_id)
      : options_(std::move(options)), role_(role), peer_id_(std::move(peer_id)) {}
  bool sender() const { return role_ == REFIT_ROLE_SENDER; }
  Status StartSender();
  Status StartReceiver();

  // Sender.
  // bytes_out: the counter of what is posted (null: pushed on the sender, forwarded on a relay).
  Status PushTo(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                std::atomic<uint64_t>* bytes_out = nullptr);
  void ReserveWindow(uint64_t bytes);
  void PostPush(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                uint64_t bytes, std::atomic<uint64_t>* bytes_out);
  uint64_t TakePushSeq(const std::string& key);
  Status PushDown(const MsgHeader& header, Bytes data);
  std::vector<ConnId> ReadyPeers();
  std::vector<ConnId> ReadyPeersLocked() const;
  std::vector<ConnId> TakePutTargetsLocked(const std::string& key);
  std::vector<ConnId> TreeChildrenLocked(size_t node);
  std::vector<size_t> SubtreeLocked(size_t node);
  void JoinTree(ConnId conn);
  void LeaveTree(ConnId conn);
  void SendTreeLocked(const std::vector<ConnId>& to);
  void OnReport(const Event& e);
  void AwaitReceivers();
  void SendPush(const std::vector<ConnId>& conns, const MsgHeader& header, Bytes data,
                uint64_t bytes, std::atomic<uint64_t>* bytes_out, bool counted);
  void LogBytesOut();
  void OnHello(const Event& e);
  void Replay(ConnId conn, const std::string& inventory);
  void OnRequest(const Event& e);
  void Reply(ConnId conn, uint64_t id, const Status& st, uint64_t value, Bytes data,
             uint64_t tree_seq = 0);
  uint64_t AwaitedPushSeq(ConnId conn, const std::string& key);
  void OnPeerDown(const Event& e);
  void OnBye(const Event& e);
  void SayByeToReceivers();
  void SendBye(const std::vector<ConnId>& conns);
  Result<Bytes> ReadSpool(const std::string& key, uint64_t offset, uint64_t len);

  // Receiver.
  void ConnectLoop();
  Status ConnectOnce();
  std::string Inventory();
  void SayBye();
  void OnSenderBye(const Event& e);
  Status FlushOutbox(ConnId conn);
  Result<std::shared_ptr<Pending>> Request(std::optional<ConnId> conn, MsgType type,
                                           const std::string& key, uint64_t a, uint64_t b,
                                           Bytes data);
  void OnPush(Event e);
  void OnReply(Event e);
  void StoreInInbox(const std::string& key, Bytes data, uint64_t tree_seq = 0);
  void OnTree(const Event& e);
  void ConnectChildren(const std::map<std::string, uint64_t>& added);
  void OnChildDown(const Event& e);
  void WaitForPushes(uint64_t pushed, uint64_t tree_seq, const std::string& key);
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
  uint64_t arrivals_ = 0;  // objects that arrived (Wait's wake-ups): pushes, or uploads
  uint64_t waited_ = 0;    // arrivals_ when the last Wait returned
  // Sender.
  std::unique_ptr<disk::DiskTransport> spool_;
  std::map<ConnId, Peer> peers_;
  std::once_flag awaited_receivers_;  // await_receivers, at the first put
  PushLedger ledger_;      // what a joining receiver gets by push, not replay (under mu_)
  uint64_t inflight_ = 0;  // both roles: the sender's pushes, a relay's forwards
  // Both roles, link_bandwidth > 0: when each connection's emulated link is free (under mu_).
  std::unique_ptr<LinkSchedule> links_;
  std::mutex tree_mu_;        // orders tree changes (kTree posts) against tree pushes
  std::vector<ConnId> tree_;  // receivers in the tree, in join order (node i+1's parent: i/k)
  uint64_t push_seq_ = 0;     // the last push seq taken, also stamped on tree placements
                              // (starts at the clock: unique across senders)
  std::map<std::string, uint64_t> push_seq_of_;  // key -> its last put's push seq
  std::atomic<uint64_t> bytes_pushed_{0};        // sender bytes out: puts pushed,
  std::atomic<uint64_t> bytes_replayed_{0};      // replays to late or re-placed receivers,
  std::atomic<uint64_t> bytes_served_{0};        // and reads served from the spool
  // Receiver.
  std::map<std::string, Entry> inbox_;
  uint64_t inbox_held_ = 0;
  uint64_t inbox_seq_ = 0;
  // Keys the sender dropped since their last push (the newest kMaxDroppedKeys): a read waiting
  // for such a key's push stops waiting (it came and went, or never will).
  std::map<std::string, uint64_t> dropped_;  // key -> its drop's serial
  std::deque<std::pair<std::string, uint64_t>> dropped_order_;
  uint64_t drops_ = 0;
  std::map<std::string, std::optional<Bytes>> outbox_;  // nullopt: a remove
  std::optional<ConnId> conn_;                          // the live connection to the sender
  std::optional<ConnId> sender_left_;  // the connection whose sender said it leaves (kBye)
  bool synced_ = false;  // a sender replayed the inbox at least once (it then knows the spool)
  std::optional<ConnId> push_conn_;  // the connection whose pushes delivered_ counts
  uint64_t delivered_ = 0;
  std::atomic<uint64_t> remote_gets_{0};  // reads the inbox could not serve (a debug line at exit)
  uint16_t relay_port_ = 0;               // k > 0: where this receiver listens for tree pushes
  std::map<std::string, ConnId> children_;  // relay: "host:port" -> connection to that child
  uint64_t placed_at_ = 0;  // tree pushes up to this seq may not reach this receiver
  std::atomic<uint64_t> bytes_forwarded_{0};
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  uint64_t next_request_ = 1;
  std::thread connector_;

  // Destroyed after the pacer (its callbacks use the fields above).
  std::unique_ptr<Worker> worker_;
  // link_bandwidth > 0: posts paced pushes to the worker; last, so destroyed first (the
  // destructor drains it before the worker stops).
  std::unique_ptr<DelayedRunner> pacer_;
};

}  // namespace refit::ucx
