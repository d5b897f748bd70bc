// Which spool objects a receiver that joins gets by push, and so must not also be replayed.
//
// A receiver becomes ready (pushes reach it from then on), then the sender lists its spool to
// replay what the receiver lacks. A put writes the spool, then takes the ready receivers it
// pushes to. A put whose spool write runs as a receiver joins would be pushed to it and listed
// for its replay: sent twice. The ledger orders the two by a count of the puts' receiver takes
// (the push epoch). Not thread-safe: the transport holds its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace refit::ucx {

class PushLedger {
 public:
  // A put of `key` starts writing the spool.
  void Begin(const std::string& key) { ++putting_[key]; }
  // The put of `key` took its receivers (every one ready now).
  void Took(const std::string& key) {
    pushed_epoch_[key] = ++epoch_;
    End(key);
  }
  // The put of `key` failed before it took any.
  void Failed(const std::string& key) { End(key); }
  // `key` was removed from the spool.
  void Forget(const std::string& key) { pushed_epoch_.erase(key); }
  // What a receiver becoming ready now records (its ready epoch).
  uint64_t epoch() const { return epoch_; }
  // Whether a receiver that became ready at `ready_epoch` gets `key` by push: a put under way
  // takes it, and a put that took its receivers later did.
  bool PushedTo(const std::string& key, uint64_t ready_epoch) const {
    if (putting_.count(key) != 0) return true;
    auto it = pushed_epoch_.find(key);
    return it != pushed_epoch_.end() && it->second > ready_epoch;
  }

 private:
  void End(const std::string& key) {
    auto it = putting_.find(key);
    if (it != putting_.end() && --it->second == 0) putting_.erase(it);
  }
  std::map<std::string, int> putting_;  // puts writing the spool, their receivers not taken yet
  uint64_t epoch_ = 0;
  std::map<std::string, uint64_t> pushed_epoch_;  // per key: the epoch its last put took
};

}  // namespace refit::ucx
