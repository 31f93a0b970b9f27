#include "smla/models/grid.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "smla/base/strings.h"

namespace smla::models {
namespace {

using kernels::KvFormat;

// The grid's models in its order, with the KV formats each is measured in (the profile's
// default format unless listed).
struct GridModel {
  std::string_view name;
  std::vector<KvFormat> formats;
};

const std::vector<GridModel>& GridModels() {
  static const std::vector<GridModel>* models = new std::vector<GridModel>{
      {"dsv4.1-flash", {KvFormat::kFp8Dsv4, KvFormat::kBf16}},
      {"dsv4-flash", {}},
      {"glm-5.2", {}},
      {"glm-5.3-flash", {}},
  };
  return *models;
}

constexpr int kGridTps[] = {8, 4, 2, 1};
constexpr int64_t kGridContexts[] = {131072, 262144};
constexpr int kDecodeRequests[] = {1, 16, 32, 64, 128};
constexpr int kDecode1Requests[] = {1, 16, 32, 64};
constexpr int kPrefillRows[] = {8192, 16384};

// "128K" for multiples of 1024, else the number.
std::string Kilo(int64_t v) {
  return v % 1024 == 0 ? absl::StrCat(v / 1024, "K") : absl::StrCat(v);
}

// "128K" -> 131072; nullopt when not a positive count of K.
std::optional<int64_t> ParseKilo(std::string_view s) {
  if (s.size() < 2 || (s.back() != 'K' && s.back() != 'k')) return std::nullopt;
  int64_t v = 0;
  if (!absl::SimpleAtoi(Sv(s.substr(0, s.size() - 1)), &v) || v <= 0) return std::nullopt;
  return v * 1024;
}

template <typename T>
bool Wanted(const std::vector<T>& filter, const T& v) {
  return filter.empty() || std::find(filter.begin(), filter.end(), v) != filter.end();
}

}  // namespace

std::string_view ShapeKindName(Shape shape) {
  switch (shape) {
    case Shape::kDecode:
      return "decode";
    case Shape::kDecode1:
      return "decode1";
    case Shape::kPrefill:
      return "prefill";
  }
  return "?";
}

std::string Cell::ShapeName() const {
  if (shape == Shape::kPrefill) return Cat("prefill ", Kilo(prefill_rows));
  return Cat(ShapeKindName(shape), " C=", requests);
}

std::string Cell::Name() const {
  std::string s = model->name;
  if (format) absl::StrAppend(&s, " ", Sv(kernels::KvFormatName(*format)));
  if (tp > 0) absl::StrAppend(&s, " TP", tp);
  absl::StrAppend(&s, " ", ShapeName(), " ", Kilo(context));
  return s;
}

absl::StatusOr<Cell> ParseCell(std::string_view name) {
  std::vector<std::string> tok = absl::StrSplit(Sv(name), ' ', absl::SkipEmpty());
  if (tok.empty()) return absl::InvalidArgumentError("cell: empty");
  Cell c;
  c.model = FindProfile(tok[0]);
  if (c.model == nullptr) {
    return absl::InvalidArgumentError(
        Cat("cell '", name, "': unknown model '", tok[0], "' (known: ", ProfileNames(), ")"));
  }
  for (size_t i = 1; i < tok.size(); ++i) {
    const std::string_view t = tok[i];
    if (std::optional<KvFormat> f = kernels::ParseKvFormat(t)) {
      c.format = f;
    } else if (t.size() > 2 && (t.starts_with("TP") || t.starts_with("tp"))) {
      if (!absl::SimpleAtoi(Sv(t.substr(2)), &c.tp) || c.tp <= 0) {
        return absl::InvalidArgumentError(Cat("cell '", name, "': bad TP '", t, "'"));
      }
    } else if (t == "decode" || t == "decode1") {
      c.shape = t == "decode" ? Shape::kDecode : Shape::kDecode1;
    } else if (t == "prefill") {
      c.shape = Shape::kPrefill;
      if (i + 1 < tok.size()) {
        if (std::optional<int64_t> rows = ParseKilo(tok[i + 1])) {
          c.prefill_rows = static_cast<int>(*rows);
          ++i;
        }
      }
    } else if (t.starts_with("C=")) {
      if (!absl::SimpleAtoi(Sv(t.substr(2)), &c.requests) || c.requests <= 0) {
        return absl::InvalidArgumentError(Cat("cell '", name, "': bad '", t, "'"));
      }
    } else if (std::optional<int64_t> context = ParseKilo(t)) {
      c.context = *context;
    } else {
      return absl::InvalidArgumentError(Cat("cell '", name, "': unknown part '", t, "'"));
    }
  }
  return c;
}

std::string LayerLabel(const LayerSpec& layer) {
  if (layer.kind == LayerKind::kChosen) return "glm";
  if (!layer.has_compressed()) return "swa";
  return absl::StrCat("c", layer.ratio);
}

std::vector<Cell> GridCells(const GridFilter& f) {
  std::vector<Cell> shapes;
  auto add_shape = [&shapes](Shape shape, int requests, int prefill_rows) {
    Cell c;
    c.shape = shape;
    c.requests = requests;
    c.prefill_rows = prefill_rows;
    shapes.push_back(c);
  };
  for (int c : kDecodeRequests) add_shape(Shape::kDecode, c, 0);
  for (int c : kDecode1Requests) add_shape(Shape::kDecode1, c, 0);
  for (int p : kPrefillRows) add_shape(Shape::kPrefill, 1, p);
  std::vector<Cell> cells;
  for (const GridModel& gm : GridModels()) {
    const ModelProfile* model = FindProfile(gm.name);
    if (!Wanted(f.models, model->name)) continue;
    const std::vector<KvFormat> formats =
        gm.formats.empty() ? std::vector<KvFormat>{model->default_format} : gm.formats;
    for (KvFormat format : formats) {
      if (!Wanted(f.formats, std::string(kernels::KvFormatName(format)))) continue;
      for (int64_t context : kGridContexts) {
        if (!Wanted(f.contexts, Kilo(context))) continue;
        for (int tp : kGridTps) {
          if (!Wanted(f.tps, tp)) continue;
          for (Cell c : shapes) {
            if (!Wanted(f.shapes, c.ShapeName()) &&
                !Wanted(f.shapes, std::string(ShapeKindName(c.shape)))) {
              continue;
            }
            c.model = model;
            c.format = format;
            c.tp = tp;
            c.context = context;
            cells.push_back(c);
          }
        }
      }
    }
  }
  return cells;
}

bool IsBarCell(const Cell& c) {
  if (c.context != 131072 || c.shape != Shape::kDecode) return false;
  if (c.model->name == "dsv4.1-flash" && c.format == KvFormat::kFp8Dsv4 &&
      (c.tp == 4 || c.tp == 2) && (c.requests == 32 || c.requests == 64)) {
    return true;
  }
  return c.model->name == "glm-5.3-flash" && c.tp == 4 && c.requests == 32;
}

}  // namespace smla::models
