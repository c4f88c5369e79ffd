#include <hyflow/core/error.hpp>
#include <hyflow/parallel/fsdp_checkpoint.hpp>

#include <torch/torch.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace hyflow::parallel {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

static_assert(std::endian::native == std::endian::little, "shard files are little-endian float32");

constexpr const char* kFormat = "hyflow-fsdp-v1";

fs::path manifest_file(const fs::path& dir) {
  return dir / "fsdp_manifest.json";
}

std::string shard_name(int shard_rank, int shard_size) {
  return "model_shard_" + std::to_string(shard_rank) + "_of_" + std::to_string(shard_size) + ".bin";
}

uint64_t fnv1a(const char* data, size_t n) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return c10::toString(t);
  }
}

// Writes `bytes` to `file` through a temporary name and a rename.
void write_atomically(const fs::path& file, const std::string& bytes) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) throw Error("cannot write '" + tmp.string() + "'");
  }
  fs::rename(tmp, file);
}

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw FormatError("sharded checkpoint: missing file '" + file.string() + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <class T>
T field(const Json& j, const char* key, const fs::path& file) {
  if (!j.is_object() || !j.contains(key)) throw FormatError("'" + file.string() + "': missing '" + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const Json::exception& e) {
    throw FormatError("'" + file.string() + "': bad '" + key + "': " + e.what());
  }
}

}  // namespace

void save_sharded_parameters(const FsdpModule& module, const fs::path& dir, const Json& extra, ProcessGroup* world) {
  const auto& mesh = module.mesh();
  const int S = mesh.shard_size(), r = mesh.shard_rank();
  const bool writer = !mesh.replicate || mesh.replicate->rank() == 0;  // replicas hold equal shards
  fs::create_directories(dir);
  const auto infos = module.shard_infos();
  const auto shards = module.local_shards();
  std::string bytes;
  Json parameters = Json::array();
  for (size_t i = 0; i < infos.size(); ++i) {
    auto data = shards[i].detach().to(at::kCPU, at::kFloat).contiguous();
    parameters.push_back({{"name", infos[i].name},
                          {"shape", infos[i].full_shape},
                          {"dtype", dtype_name(infos[i].dtype)},
                          {"rows", infos[i].rows},
                          {"rows_per_shard", infos[i].rows_per_shard},
                          {"offset", bytes.size()}});
    bytes.append(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(data.numel()) * sizeof(float));
  }
  const uint64_t checksum = fnv1a(bytes.data(), bytes.size());
  if (writer) write_atomically(dir / shard_name(r, S), bytes);
  // every shard rank's checksum, for the manifest (the bits of a uint64 carried as int64)
  auto sums = torch::tensor({static_cast<int64_t>(checksum), static_cast<int64_t>(bytes.size())}, torch::kLong);
  std::vector<at::Tensor> all{sums};
  if (mesh.shard) all = mesh.shard->all_gather(sums);
  if (writer && r == 0) {
    Json files = Json::array();
    for (int s = 0; s < S; ++s)
      files.push_back({{"shard_rank", s},
                       {"file", shard_name(s, S)},
                       {"bytes", all[static_cast<size_t>(s)][1].item<int64_t>()},
                       {"fnv1a64", static_cast<uint64_t>(all[static_cast<size_t>(s)][0].item<int64_t>())}});
    const Json manifest = {{"format", kFormat},
                           {"world_size", world ? world->size() : 1},
                           {"mesh", {{"shard_size", S}, {"replicate_size", mesh.replicate_size()}}},
                           {"extra", extra},
                           {"parameters", parameters},
                           {"shards", files}};
    write_atomically(manifest_file(dir), manifest.dump(2) + "\n");
  }
  if (world) world->barrier();
}

std::vector<NamedParameter> load_sharded_parameters(const fs::path& dir, Json* extra) {
  const fs::path mfile = manifest_file(dir);
  Json manifest;
  try {
    manifest = Json::parse(read_all(mfile));
  } catch (const Json::exception& e) {
    throw FormatError("'" + mfile.string() + "' is not JSON: " + e.what());
  }
  if (field<std::string>(manifest, "format", mfile) != kFormat)
    throw FormatError("'" + mfile.string() + "' has format " + manifest.at("format").dump() + ", expected " + kFormat);
  const Json files = field<Json>(manifest, "shards", mfile);
  const Json params = field<Json>(manifest, "parameters", mfile);
  if (!files.is_array() || files.empty() || !params.is_array())
    throw FormatError("'" + mfile.string() + "': 'shards' and 'parameters' must be lists");
  const int64_t S = static_cast<int64_t>(files.size());
  std::vector<std::string> data(files.size());
  for (const auto& f : files) {
    const auto s = field<int64_t>(f, "shard_rank", mfile);
    if (s < 0 || s >= S)
      throw FormatError("'" + mfile.string() + "': shard_rank " + std::to_string(s) + " out of range");
    const fs::path file = dir / field<std::string>(f, "file", mfile);
    auto& bytes = data[static_cast<size_t>(s)];
    bytes = read_all(file);
    const auto expected = field<uint64_t>(f, "bytes", mfile);
    if (bytes.size() != expected)
      throw FormatError("'" + file.string() + "' has " + std::to_string(bytes.size()) + " bytes, the manifest says " +
                        std::to_string(expected));
    if (fnv1a(bytes.data(), bytes.size()) != field<uint64_t>(f, "fnv1a64", mfile))
      throw FormatError("'" + file.string() + "' fails its checksum (fnv1a64 in " + mfile.filename().string() + ")");
  }
  std::vector<NamedParameter> out;
  for (const auto& p : params) {
    const auto name = field<std::string>(p, "name", mfile);
    const auto shape = field<std::vector<int64_t>>(p, "shape", mfile);
    const auto rows = field<int64_t>(p, "rows", mfile), per = field<int64_t>(p, "rows_per_shard", mfile);
    const auto offset = field<int64_t>(p, "offset", mfile);
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const int64_t row_numel = rows == 0 ? 0 : numel / rows;
    if (rows < 0 || per < 0 || offset < 0 || per * S < rows)
      throw FormatError("'" + mfile.string() + "': parameter '" + name + "' has inconsistent rows");
    auto full = torch::empty({rows, row_numel}, torch::kFloat);
    const size_t bytes = static_cast<size_t>(per * row_numel) * sizeof(float);
    for (int64_t s = 0; s < S; ++s) {
      const auto& shard = data[static_cast<size_t>(s)];
      if (static_cast<size_t>(offset) + bytes > shard.size())
        throw FormatError("'" + (dir / shard_name(static_cast<int>(s), static_cast<int>(S))).string() +
                          "' ends before parameter '" + name + "' (offset " + std::to_string(offset) + ")");
      const int64_t begin = std::min(s * per, rows), count = std::min(begin + per, rows) - begin;
      if (count <= 0) continue;
      std::memcpy(full.narrow(0, begin, count).data_ptr(), shard.data() + offset,
                  static_cast<size_t>(count * row_numel) * sizeof(float));
    }
    out.push_back({name, full.view(shape)});
  }
  if (extra) *extra = manifest.contains("extra") ? manifest.at("extra") : Json();
  return out;
}

}  // namespace hyflow::parallel
