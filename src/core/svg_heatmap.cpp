#include "core/svg_heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/user_file.h"

namespace entropyinfer {
namespace {

// A perceptually ordered dark-blue -> yellow ramp, interpolated between a few anchor colours.
std::string colour(double t) {
  static const double anchors[][3] = {
      {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4.0;
  const int index = std::min(3, static_cast<int>(t));
  const double f = t - index;
  char text[16];
  std::snprintf(
      text, sizeof(text), "#%02x%02x%02x",
      static_cast<int>(anchors[index][0] + f * (anchors[index + 1][0] - anchors[index][0])),
      static_cast<int>(anchors[index][1] + f * (anchors[index + 1][1] - anchors[index][1])),
      static_cast<int>(anchors[index][2] + f * (anchors[index + 1][2] - anchors[index][2])));
  return text;
}

}  // namespace

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

void write_heatmap_svg(const Heatmap& heatmap, const std::string& path) {
  if (heatmap.rows <= 0 || heatmap.columns <= 0 ||
      heatmap.values.size() != static_cast<size_t>(heatmap.rows) * heatmap.columns) {
    throw Error("heatmap '" + heatmap.title +
                "' has no cells or a value count that does not match");
  }
  double low = INFINITY, high = -INFINITY;
  for (double value : heatmap.values) {
    if (std::isnan(value)) continue;
    low = std::min(low, value);
    high = std::max(high, value);
  }
  if (!std::isfinite(low)) low = high = 0.0;
  const double span = high > low ? high - low : 1.0;
  const double cell_width = std::clamp(720.0 / heatmap.columns, 2.0, 24.0);
  const double cell_height = std::clamp(560.0 / heatmap.rows, 2.0, 18.0);
  const double left = 90, top = 40, bar_width = 16;
  const double plot_width = cell_width * heatmap.columns, plot_height = cell_height * heatmap.rows;
  const double width = left + plot_width + 110, height = top + plot_height + 50;

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"22\" font-size=\"14\">" << escape_xml(heatmap.title)
      << "</text>\n";
  for (int row = 0; row < heatmap.rows; ++row) {
    for (int column = 0; column < heatmap.columns; ++column) {
      const double value = heatmap.values[static_cast<size_t>(row) * heatmap.columns + column];
      if (std::isnan(value)) continue;
      svg << "<rect x=\"" << left + column * cell_width << "\" y=\"" << top + row * cell_height
          << "\" width=\"" << cell_width << "\" height=\"" << cell_height << "\" fill=\""
          << colour((value - low) / span) << "\"><title>row " << row << ", column " << column
          << ": " << value << "</title></rect>\n";
    }
    if (static_cast<size_t>(row) < heatmap.row_labels.size() && cell_height >= 8) {
      svg << "<text x=\"" << left - 4 << "\" y=\"" << top + (row + 0.75) * cell_height
          << "\" text-anchor=\"end\">" << escape_xml(heatmap.row_labels[row]) << "</text>\n";
    }
  }
  svg << "<text x=\"" << left + plot_width / 2 << "\" y=\"" << top + plot_height + 30
      << "\" text-anchor=\"middle\">" << escape_xml(heatmap.x_label) << "</text>\n";
  svg << "<text transform=\"translate(14," << top + plot_height / 2
      << ") rotate(-90)\" text-anchor=\"middle\">" << escape_xml(heatmap.y_label) << "</text>\n";
  // Colour bar with its range.
  const double bar_left = left + plot_width + 20;
  for (int step = 0; step < 50; ++step) {
    svg << "<rect x=\"" << bar_left << "\" y=\"" << top + plot_height * (49 - step) / 50.0
        << "\" width=\"" << bar_width << "\" height=\"" << plot_height / 50.0 + 0.5 << "\" fill=\""
        << colour(step / 49.0) << "\"/>\n";
  }
  svg << "<text x=\"" << bar_left + bar_width + 4 << "\" y=\"" << top + 10 << "\">" << high
      << "</text>\n";
  svg << "<text x=\"" << bar_left + bar_width + 4 << "\" y=\"" << top + plot_height << "\">" << low
      << "</text>\n";
  svg << "<text x=\"" << bar_left << "\" y=\"" << top + plot_height + 30 << "\">"
      << escape_xml(heatmap.value_label) << "</text>\n";
  svg << "</svg>\n";
  write_user_file(path, "heatmap", svg.str());
}

}  // namespace entropyinfer
