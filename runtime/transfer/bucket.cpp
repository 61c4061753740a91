#include "runtime/transfer/bucket.hpp"

#include "runtime/base/checksum.hpp"
#include "runtime/transfer/puller.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace rlsync::transfer {

namespace {

// Cuts a sequence of tensors into buckets; shared by both bucketize forms.
class bucketizer {
public:
  bucketizer(std::uint64_t version, std::uint32_t group, std::uint64_t bucket_bytes)
      : version_(version), group_(group), limit_(bucket_bytes) {}

  void add(const tensor_spec& spec, const std::uint8_t* data) {
    const std::uint64_t es = dtype_size(spec.type), total = spec.bytes();
    if (limit_ < es)
      throw std::invalid_argument("bucketize: bucket_bytes " + std::to_string(limit_) + " is smaller than one "
                                  + std::string(short_name(spec.type)) + " element");
    std::uint64_t done = 0;
    do {
      // A tensor that fits a bucket stays whole: it starts a new bucket
      // rather than being cut; a larger one fills what room is left.
      if (!open_ || (done == 0 && total > room() && total <= limit_) || (done < total && room() < es))
        open_bucket();
      const std::uint64_t take = std::min(total - done, room() / es * es);
      bucket_entry e;
      e.name = spec.name;
      e.dtype = static_cast<std::uint8_t>(spec.type);
      if (done == 0 && take == total)
        e.shape = spec.shape;
      else
        e.shape = {static_cast<std::int64_t>(take / es)};
      e.offset = current_.data.size();
      e.bytes = take;
      e.tensor_offset = done;
      current_.data.insert(current_.data.end(), data + done, data + done + take);
      current_.entries.push_back(std::move(e));
      done += take;
    } while (done < total);
  }

  std::vector<weight_bucket> finish() {
    close_bucket();
    return std::move(out_);
  }

private:
  std::uint64_t room() const { return limit_ - current_.data.size(); }

  void open_bucket() {
    if (open_ && current_.entries.empty())
      return;
    close_bucket();
    current_ = weight_bucket{};
    current_.version = version_;
    current_.group = group_;
    open_ = true;
  }

  void close_bucket() {
    if (!open_)
      return;
    current_.checksum = checksum64(current_.data.data(), current_.data.size());
    out_.push_back(std::move(current_));
    open_ = false;
  }

  std::uint64_t version_;
  std::uint32_t group_;
  std::uint64_t limit_;
  weight_bucket current_;
  bool open_ = false;
  std::vector<weight_bucket> out_;
};

} // namespace

std::vector<weight_bucket> bucketize(std::uint64_t version, std::uint32_t group,
                                     const std::vector<tensor_view>& tensors, std::uint64_t bucket_bytes) {
  bucketizer b(version, group, bucket_bytes);
  for (const auto& t : tensors)
    b.add(t, reinterpret_cast<const std::uint8_t*>(t.data));
  return b.finish();
}

std::vector<weight_bucket> bucketize_packed(std::uint64_t version, std::uint32_t group, dtype type,
                                            const std::uint8_t* bytes, std::size_t size,
                                            std::uint64_t bucket_bytes) {
  if (size % dtype_size(type) != 0)
    throw std::invalid_argument("bucketize: " + std::to_string(size) + " packed bytes are not whole "
                                + std::string(short_name(type)) + " elements");
  tensor_spec spec{packed_entry_name, type, {static_cast<std::int64_t>(size / dtype_size(type))}};
  bucketizer b(version, group, bucket_bytes);
  b.add(spec, bytes);
  return b.finish();
}

bool verify_bucket(const weight_bucket& b) {
  return checksum64(b.data.data(), b.data.size()) == b.checksum;
}

std::vector<tensor_view> whole_tensor_views(const weight_bucket& b) {
  std::vector<tensor_view> views;
  for (const auto& e : b.entries) {
    if (e.tensor_offset != 0)
      throw std::invalid_argument(e.name + ": a piece of a split tensor, not a whole one");
    tensor_view v;
    v.name = e.name;
    v.type = static_cast<dtype>(e.dtype);
    v.shape = e.shape;
    v.data = reinterpret_cast<const std::byte*>(b.data.data() + e.offset);
    v.size = e.bytes;
    views.push_back(std::move(v));
  }
  return views;
}

bucket_assembler::bucket_assembler(std::vector<tensor_spec> expected) {
  for (auto& s : expected) {
    if (!index_.emplace(s.name, slots_.size()).second)
      throw std::invalid_argument("bucket assembler: tensor '" + s.name + "' expected twice");
    slot x;
    x.bytes.resize(static_cast<std::size_t>(s.bytes()));
    x.spec = std::move(s);
    slots_.push_back(std::move(x));
  }
}

void bucket_assembler::add(const weight_bucket& b) {
  if (auto problem = check(b); !problem.empty())
    throw std::invalid_argument("bucket of group " + std::to_string(b.group) + ": " + problem);
  if (!verify_bucket(b))
    throw transfer_error(transfer_failure::checksum_mismatch,
                         "bucket of group " + std::to_string(b.group) + " of version " + std::to_string(b.version)
                             + ": checksum mismatch over " + std::to_string(b.data.size()) + " bytes");
  // Validate every entry before copying any, so a bad bucket changes nothing.
  const auto overlaps = [](const std::map<std::uint64_t, std::uint64_t>& pieces, std::uint64_t at, std::uint64_t n) {
    auto next = pieces.lower_bound(at);
    return (next != pieces.end() && next->first < at + n) || (next != pieces.begin() && std::prev(next)->second > at);
  };
  std::map<std::string, std::map<std::uint64_t, std::uint64_t>> in_this_bucket; // pieces of earlier entries
  for (const auto& e : b.entries) {
    auto it = index_.find(e.name);
    if (it == index_.end())
      throw std::invalid_argument("bucket: unexpected tensor '" + e.name + "'");
    const slot& s = slots_[it->second];
    const std::uint64_t total = s.spec.bytes();
    if (e.dtype != static_cast<std::uint8_t>(s.spec.type))
      throw std::invalid_argument("bucket: tensor '" + e.name + "': dtype differs from the expected "
                                  + std::string(short_name(s.spec.type)));
    if (e.tensor_offset > total || e.bytes > total - e.tensor_offset || e.tensor_offset % dtype_size(s.spec.type))
      throw std::invalid_argument("bucket: tensor '" + e.name + "': piece [" + std::to_string(e.tensor_offset)
                                  + ", +" + std::to_string(e.bytes) + ") outside its " + std::to_string(total)
                                  + " bytes");
    const bool whole = e.tensor_offset == 0 && e.bytes == total;
    if (whole && e.shape != s.spec.shape && e.shape != std::vector<std::int64_t>{s.spec.numel()})
      throw std::invalid_argument("bucket: tensor '" + e.name + "': shape " + shape_string(e.shape)
                                  + ", expected " + shape_string(s.spec.shape));
    if (e.bytes == 0)
      continue;
    auto& earlier = in_this_bucket[e.name];
    if (overlaps(s.pieces, e.tensor_offset, e.bytes) || overlaps(earlier, e.tensor_offset, e.bytes))
      throw std::invalid_argument("bucket: tensor '" + e.name + "': bytes [" + std::to_string(e.tensor_offset)
                                  + ", +" + std::to_string(e.bytes) + ") received twice");
    earlier.emplace(e.tensor_offset, e.tensor_offset + e.bytes);
  }
  for (const auto& e : b.entries) {
    slot& s = slots_[index_.at(e.name)];
    if (e.bytes == 0)
      continue;
    std::memcpy(s.bytes.data() + e.tensor_offset, b.data.data() + e.offset, static_cast<std::size_t>(e.bytes));
    s.pieces.emplace(e.tensor_offset, e.tensor_offset + e.bytes);
    s.filled += e.bytes;
    received_ += e.bytes;
  }
}

bool bucket_assembler::complete() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const slot& s) { return s.filled == s.spec.bytes(); });
}

std::vector<tensor_view> bucket_assembler::tensors() const {
  if (!complete())
    throw std::logic_error("bucket assembler: tensors requested before every byte arrived");
  std::vector<tensor_view> out;
  for (const auto& s : slots_) {
    tensor_view v;
    static_cast<tensor_spec&>(v) = s.spec;
    v.data = reinterpret_cast<const std::byte*>(s.bytes.data());
    v.size = s.bytes.size();
    out.push_back(std::move(v));
  }
  return out;
}

void write_checksum_trailer(std::uint64_t sum, std::uint8_t* to) {
  for (std::size_t k = 0; k < checksum_trailer_bytes; ++k)
    to[k] = static_cast<std::uint8_t>(sum >> (8 * k));
}

std::uint64_t read_checksum_trailer(const std::uint8_t* at) {
  std::uint64_t sum = 0;
  for (std::size_t k = 0; k < checksum_trailer_bytes; ++k)
    sum |= std::uint64_t{at[k]} << (8 * k);
  return sum;
}

void append_checksum(std::vector<std::uint8_t>& bytes) {
  const auto sum = checksum64(bytes.data(), bytes.size());
  bytes.resize(bytes.size() + checksum_trailer_bytes);
  write_checksum_trailer(sum, bytes.data() + bytes.size() - checksum_trailer_bytes);
}

namespace {
// The packed bytes before the trailer of a bucket of `size` bytes.
std::size_t before_trailer(std::size_t size) {
  if (size < checksum_trailer_bytes)
    throw std::invalid_argument("a bucket of " + std::to_string(size) + " bytes has no room for its checksum");
  return size - checksum_trailer_bytes;
}
} // namespace

std::uint64_t pop_checksum(std::vector<std::uint8_t>& bytes) {
  const std::size_t n = before_trailer(bytes.size());
  const auto sum = read_checksum_trailer(bytes.data() + n);
  bytes.resize(n);
  return sum;
}

std::pair<std::vector<std::uint8_t>, std::uint64_t> split_checksum(const std::uint8_t* bytes, std::size_t size) {
  const std::size_t n = before_trailer(size);
  return {std::vector<std::uint8_t>(bytes, bytes + n), read_checksum_trailer(bytes + n)};
}

} // namespace rlsync::transfer
