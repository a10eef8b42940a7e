// A heatmap written as a standalone SVG file: no plotting library needed, and it opens in any
// browser.
#pragma once

#include <string>
#include <vector>

namespace entropyinfer {

struct Heatmap {
  std::string title;
  std::string x_label;
  std::string y_label;
  int rows = 0;
  int columns = 0;
  std::vector<double> values;           // rows * columns, row-major; NaN cells are drawn blank
  std::vector<std::string> row_labels;  // optional, one per row
  std::string value_label;              // shown beside the colour bar
};

// Throws Error if the file cannot be written.
void write_heatmap_svg(const Heatmap& heatmap, const std::string& path);

// Text escaped for SVG/XML element content and attribute values (&, <, >, ").
std::string escape_xml(const std::string& text);

}  // namespace entropyinfer
